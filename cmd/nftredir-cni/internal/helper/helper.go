// Package helper is how nftredir-cni reaches nftredir-cni-helper, the
// binary beside it that holds what the runtime need not load for every
// pod: the installer, and the one Kubernetes API read the plugin ever
// makes (when nftredird cannot answer, whether the enrolment policy
// captures the pod; docs/blast-radius.md).
//
// The runtime execs the plugin for every pod, and an HTTPS client
// (net/http, crypto/tls) and a file watcher linked into it cost every pod
// start about 0.6 ms of start-up (BENCHMARKS.md, "The floor") while only
// the daemon-down path and the installer use them. The helper is exec'd only there. A lookup's
// request goes to its stdin as JSON, the decision comes back on its
// stdout, a failure as its exit status and the message on its stderr.
//
// This package stays as light as the plugin: the standard library and
// internal/enrolment.
package helper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/enrolment"
)

// Name is the helper binary's name; the installer puts it in the same
// directories as the plugin.
const Name = "nftredir-cni-helper"

// The helper's subcommands.
const (
	Install   = "install"
	Uninstall = "uninstall"
	Lookup    = "lookup"
)

// Request is what the plugin asks: is pod Namespace/Name (with UID, when
// the runtime gave it) captured by Selector, read with Kubeconfig, within
// Timeout (retries included).
type Request struct {
	Kubeconfig           string
	Selector             enrolment.Selector
	Namespace, Name, UID string
	Timeout              time.Duration
}

// wireRequest is Request as JSON, its selector spelt as the plugin's
// config spells it and its timeout as a Go duration string.
type wireRequest struct {
	Kubeconfig   string `json:"kubeconfig"`
	ModeLabel    string `json:"modeLabel"`
	ModeEnabled  string `json:"modeEnabled"`
	ModeDisabled string `json:"modeDisabled"`
	Namespace    string `json:"namespace"`
	Name         string `json:"name"`
	UID          string `json:"uid,omitempty"`
	Timeout      string `json:"timeout"`
}

// Decision is the enrolment policy's verdict on the pod and its reason.
type Decision struct {
	Captured bool   `json:"captured"`
	Why      string `json:"why"`
}

// grace is how long past the request's own timeout the plugin waits for
// the helper before killing it: the helper ends its lookup at the timeout
// and reports why, which says more than a killed process.
const grace = 500 * time.Millisecond

// Ask runs a lookup in the helper at path. It returns the helper's
// decision, or an error carrying the helper's message.
func Ask(ctx context.Context, helper string, req Request) (Decision, error) {
	in, err := json.Marshal(wireRequest{
		Kubeconfig: req.Kubeconfig, ModeLabel: req.Selector.Label, ModeEnabled: req.Selector.Enabled,
		ModeDisabled: req.Selector.Disabled, Namespace: req.Namespace, Name: req.Name, UID: req.UID,
		Timeout: req.Timeout.String(),
	})
	if err != nil {
		return Decision{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, req.Timeout+grace)
	defer cancel()
	// cmd.Env stays nil: the environment passes through, as when the
	// plugin read the API itself (a proxy setting applies alike).
	cmd := exec.CommandContext(ctx, helper, Lookup)
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = grace
	err = cmd.Run()
	if msg := strings.TrimSpace(stderr.String()); err != nil && msg != "" {
		return Decision{}, errors.New(msg)
	}
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, fmt.Errorf("%s did not answer within %v", helper, req.Timeout+grace)
		}
		return Decision{}, fmt.Errorf("run %s (installed beside the plugin by nftredir-cni install): %w", helper, err)
	}
	var d Decision
	answer := stdout.Bytes()
	dec := json.NewDecoder(bytes.NewReader(answer))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Decision{}, fmt.Errorf("%s answered %q: %w", helper, answer, err)
	}
	return d, nil
}

// Beside is the helper's path next to the running executable, as the
// installer puts the two.
func Beside() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the plugin's own directory: %w", err)
	}
	return filepath.Join(filepath.Dir(self), Name), nil
}

// Serve is the helper's side of one lookup: it reads a request from r,
// decides it with decide and writes the decision to w. An error is for
// the helper to print on its stderr and exit non-zero.
func Serve(r io.Reader, w io.Writer, decide func(context.Context, Request) (Decision, error)) error {
	var wr wireRequest
	dec := json.NewDecoder(io.LimitReader(r, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&wr); err != nil {
		return fmt.Errorf("read the lookup request on stdin: %w", err)
	}
	timeout, err := time.ParseDuration(wr.Timeout)
	if err != nil || timeout <= 0 {
		return fmt.Errorf("lookup request: timeout %q is not a positive duration", wr.Timeout)
	}
	req := Request{
		Kubeconfig: wr.Kubeconfig,
		Selector:   enrolment.Selector{Label: wr.ModeLabel, Enabled: wr.ModeEnabled, Disabled: wr.ModeDisabled},
		Namespace:  wr.Namespace, Name: wr.Name, UID: wr.UID, Timeout: timeout,
	}
	switch {
	case !filepath.IsAbs(req.Kubeconfig):
		return fmt.Errorf("lookup request: kubeconfig %q is not an absolute path", req.Kubeconfig)
	case req.Namespace == "" || req.Name == "":
		return errors.New("lookup request: namespace and name are required")
	}
	if err := req.Selector.Validate(); err != nil {
		return fmt.Errorf("lookup request: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d, err := decide(ctx, req)
	if err != nil {
		return err
	}
	return json.NewEncoder(w).Encode(d)
}
