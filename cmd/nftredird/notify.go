package main

import (
	sd "github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
)

// notifyReady tells systemd (Type=notify, deploy/systemd/nftredird.service)
// that the daemon is up. It is sent after the startup reconcile, as the
// last step before health turns SERVING, so units ordered After= it find
// every recorded pod repaired. Without NOTIFY_SOCKET it does nothing.
func notifyReady(log hclog.Logger) {
	sent, err := sd.SdNotify(false, sd.SdNotifyReady)
	if err != nil {
		// Not fatal: serving matters more than telling systemd, which
		// then fails the unit on its start timeout, visibly.
		log.Warn("cannot notify systemd of readiness", "error", err)
		return
	}
	if sent {
		log.Debug("notified systemd: READY=1")
	}
}
