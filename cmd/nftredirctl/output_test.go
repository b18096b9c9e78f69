package main

import (
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

func TestZDSStateShownWhenTheDaemonServesZDS(t *testing.T) {
	a := &app{now: func() time.Time { return now }}
	enrolled := timestamppb.New(now.Add(-5 * time.Minute))
	pods := []*nftredirv1.Pod{
		{PodUid: "a1", PodName: "web", PodNamespace: "shop", NetnsPath: "/run/netns/a", Options: &nftredirv1.RedirectOptions{CaptureMode: nftredirv1.CaptureMode_CAPTURE_MODE_TPROXY}, EnrolledAt: enrolled, ZdsState: proto.String("acked")},
		{PodUid: "b2", NetnsPath: "/run/netns/b", Options: &nftredirv1.RedirectOptions{CaptureMode: nftredirv1.CaptureMode_CAPTURE_MODE_TPROXY}, EnrolledAt: enrolled, ZdsState: proto.String("no proxy connected")},
	}
	var out strings.Builder
	if err := a.printTable(&out, pods); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"NAMESPACE  NAME  POD UID  NETNS         IPS  MODE    ZDS                 AGE\n" +
		"shop       web   a1       /run/netns/a  -    tproxy  acked               5m\n" +
		"-          -     b2       /run/netns/b  -    tproxy  no proxy connected  5m\n"
	if out.String() != want {
		t.Errorf("list:\n got:\n%s\nwant:\n%s", out.String(), want)
	}

	out.Reset()
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	a.printPod(tw, pods[0])
	tw.Flush()
	if !strings.Contains(out.String(), "ZDS state:                acked\n") {
		t.Errorf("get does not show the ZDS state:\n%s", out.String())
	}

	// Without ZDS the daemon leaves the field unset: no column, no row.
	pods[0].ZdsState, pods[1].ZdsState = nil, nil
	out.Reset()
	if err := a.printTable(&out, pods); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "ZDS") {
		t.Errorf("list without ZDS shows a ZDS column:\n%s", out.String())
	}
	out.Reset()
	tw = tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	a.printPod(tw, pods[0])
	tw.Flush()
	if strings.Contains(out.String(), "ZDS") {
		t.Errorf("get without ZDS shows a ZDS row:\n%s", out.String())
	}
}

func TestPermissionDeniedHint(t *testing.T) {
	var errOut strings.Builder
	a := &app{stderr: &errOut, socket: "/run/nftredir/nftredir.sock"}
	a.failed("list", status.Error(codes.Unavailable,
		`connection error: desc = "transport: error while dialing: dial unix /run/nftredir/nftredir.sock: connect: permission denied"`))
	got := errOut.String()
	if !strings.Contains(got, "refuse this user") || !strings.Contains(got, "--socket-group") || !strings.Contains(got, "--allow-uid") {
		t.Errorf("hint for a refused connect:\n%s", got)
	}
	if strings.Contains(got, "is nftredird running") {
		t.Errorf("a refused connect is not a missing daemon:\n%s", got)
	}
}
