package lifecycle

import (
	"context"
	"fmt"
	"strings"

	"github.com/nftredir/nftredir/capture"
	"github.com/nftredir/nftredir/netns"
	"github.com/nftredir/nftredir/nft"
	"github.com/nftredir/nftredir/state"
)

// openRecorded opens the namespace a record names. When the path is gone
// or now names another namespace it returns a nil handle and the reason;
// an error means the question could not be answered.
func (m *Manager) openRecorded(rec *state.Record) (capture.Namespace, string, error) {
	want, err := rec.NamespaceID()
	if err != nil {
		return nil, "", err
	}
	h, err := m.open(rec.NetnsPath)
	if err != nil {
		if namespaceGone(err) {
			return nil, err.Error(), nil
		}
		return nil, "", err
	}
	if h.ID() != want {
		h.Close()
		return nil, fmt.Sprintf("%s now names namespace %s, not the enrolled %s", rec.NetnsPath, h.ID(), want), nil
	}
	return h, "", nil
}

// liveState is what a record's namespace holds right now.
type liveState struct {
	gone bool
	capture.Live
	detail string // for people: what differs, or why it is gone
}

func (l liveState) inSync() bool { return !l.gone && l.InSync() }

// inspect opens the record's namespace and compares it with the record.
func (m *Manager) inspect(ctx context.Context, rec *state.Record) (liveState, error) {
	h, reason, err := m.openRecorded(rec)
	if err != nil {
		return liveState{}, err
	}
	if h == nil {
		return liveState{gone: true, detail: reason}, nil
	}
	defer h.Close()
	return m.inspectHandle(ctx, h, rec)
}

func (m *Manager) inspectHandle(ctx context.Context, h capture.Namespace, rec *state.Record) (liveState, error) {
	rs, err := rec.Ruleset()
	if err != nil {
		return liveState{}, err
	}
	live, err := h.Inspect(ctx, rs, rec.Routing.Netns())
	if err != nil {
		return liveState{}, err
	}
	st, rt := live.Table, live.Routing
	l := liveState{Live: live}
	var details []string
	switch st {
	case nft.StatusAbsent:
		details = append(details, fmt.Sprintf("table inet %s is missing", nft.TableName))
	case nft.StatusDrifted:
		details = append(details, "the table differs from the record"+driftSummary(live.Text))
	}
	if missing := missingRouting(rt); missing != "" {
		details = append(details, "policy routing is incomplete, missing "+missing)
	}
	if live.Foreign != "" {
		details = append(details, "another agent's capture is in the namespace: "+live.Foreign)
	}
	if len(details) > 0 {
		l.detail = strings.Join(details, "; ") + "; reconcile or a repeated AddPod restores it"
	}
	return l, nil
}

// driftSummary lifts the "# drift:" line nft's Verify appends to the live
// text, so the detail says what differs without reading the whole table.
func driftSummary(text string) string {
	for line := range strings.Lines(text) {
		if rest, ok := strings.CutPrefix(line, "# drift: "); ok {
			return " (" + strings.TrimSpace(rest) + ")"
		}
	}
	return ""
}

func missingRouting(rt netns.RoutingState) string {
	var m []string
	if !rt.V4Rule {
		m = append(m, "IPv4 fwmark rule")
	}
	if !rt.V4Route {
		m = append(m, "IPv4 local route")
	}
	if rt.V6Capable && !rt.V6Rule {
		m = append(m, "IPv6 fwmark rule")
	}
	if rt.V6Capable && !rt.V6Route {
		m = append(m, "IPv6 local route")
	}
	return strings.Join(m, ", ")
}
