package helper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nftredir/nftredir/internal/enrolment"
)

// asHelperEnv makes the test binary act as the helper (Ask passes its
// environment on): "serve" answers through Serve, deciding by the pod's
// name; the other values misbehave as a broken helper would.
const asHelperEnv = "NFTREDIR_CNI_HELPER_TEST_AS"

func TestMain(m *testing.M) {
	switch os.Getenv(asHelperEnv) {
	case "":
		os.Exit(m.Run())
	case "serve":
		err := Serve(os.Stdin, os.Stdout, func(ctx context.Context, req Request) (Decision, error) {
			if req.Name == "fail" {
				return Decision{}, errors.New("read pod shop/fail: 503 Service Unavailable")
			}
			if _, ok := ctx.Deadline(); !ok {
				return Decision{}, errors.New("no deadline")
			}
			return Decision{Captured: req.Name == "in", Why: fmt.Sprintf("%s/%s uid %q by %s=%s within %v", req.Namespace, req.Name, req.UID, req.Selector.Label, req.Selector.Enabled, req.Timeout)}, nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "garbage":
		fmt.Print("yes")
	case "hang":
		time.Sleep(time.Minute)
	}
	os.Exit(0)
}

func request(name string) Request {
	return Request{Kubeconfig: "/etc/cni/net.d/nftredir-cni.kubeconfig", Selector: enrolment.DefaultSelector(),
		Namespace: "shop", Name: name, UID: "uid-1", Timeout: 2 * time.Second}
}

func TestAskServeRoundTrip(t *testing.T) {
	t.Setenv(asHelperEnv, "serve")
	for name, captured := range map[string]bool{"in": true, "out": false} {
		d, err := Ask(context.Background(), os.Args[0], request(name))
		want := fmt.Sprintf(`shop/%s uid "uid-1" by istio.io/dataplane-mode=ambient within 2s`, name)
		if err != nil || d.Captured != captured || d.Why != want {
			t.Errorf("%s: %+v %v; want captured %v, why %q", name, d, err, captured, want)
		}
	}
	if _, err := Ask(context.Background(), os.Args[0], request("fail")); err == nil || err.Error() != "read pod shop/fail: 503 Service Unavailable" {
		t.Errorf("a failed lookup: %v; want the helper's message", err)
	}
}

func TestAskBrokenHelper(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		_, err := Ask(context.Background(), "/nonexistent/"+Name, request("in"))
		if err == nil || !strings.Contains(err.Error(), "/nonexistent/"+Name) || !strings.Contains(err.Error(), "nftredir-cni install") {
			t.Errorf("%v; want the missing path and how it gets there", err)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		t.Setenv(asHelperEnv, "garbage")
		if _, err := Ask(context.Background(), os.Args[0], request("in")); err == nil || !strings.Contains(err.Error(), `"yes"`) {
			t.Errorf("%v; want the answer quoted", err)
		}
	})
	t.Run("hangs", func(t *testing.T) {
		t.Setenv(asHelperEnv, "hang")
		req := request("in")
		req.Timeout = 100 * time.Millisecond
		begin := time.Now()
		_, err := Ask(context.Background(), os.Args[0], req)
		if err == nil || !strings.Contains(err.Error(), "did not answer within 600ms") {
			t.Errorf("%v; want the timeout named", err)
		}
		if d := time.Since(begin); d > 10*time.Second {
			t.Errorf("Ask returned after %v", d)
		}
	})
}

// The helper refuses a request it cannot act on, before any lookup.
func TestServeRefusesBadRequests(t *testing.T) {
	good := `"kubeconfig":"/k","modeLabel":"l","modeEnabled":"on","modeDisabled":"off","namespace":"shop","name":"cart-0"`
	for _, tc := range []struct{ in, want string }{
		{`{` + good + `,"timeout":"1s","extra":1}`, "unknown field"},
		{`{` + good + `}`, "timeout"},
		{`{` + good + `,"timeout":"-1s"}`, "timeout"},
		{`{"kubeconfig":"k","modeLabel":"l","modeEnabled":"on","namespace":"shop","name":"cart-0","timeout":"1s"}`, "absolute"},
		{`{"kubeconfig":"/k","modeLabel":"l","modeEnabled":"on","namespace":"shop","timeout":"1s"}`, "namespace and name"},
		{`{"kubeconfig":"/k","modeLabel":"l","modeEnabled":"x","modeDisabled":"x","namespace":"shop","name":"cart-0","timeout":"1s"}`, "lookup request"},
		{`not json`, "stdin"},
	} {
		called := false
		err := Serve(strings.NewReader(tc.in), &strings.Builder{}, func(context.Context, Request) (Decision, error) {
			called = true
			return Decision{}, nil
		})
		if err == nil || !strings.Contains(err.Error(), tc.want) || called {
			t.Errorf("%s: %v (looked up: %v); want an error with %q and no lookup", tc.in, err, called, tc.want)
		}
	}
}
