package nri_test

import (
	"context"
	"os"
	"testing"

	nrilog "github.com/containerd/nri/pkg/log"
)

// TestMain keeps the runtime library's own log out of the test output:
// it is the runtime's, written to stderr through logrus, and the tests
// check its effects.
func TestMain(m *testing.M) {
	nrilog.Set(quiet{})
	os.Exit(m.Run())
}

type quiet struct{}

func (quiet) Debugf(context.Context, string, ...any) {}
func (quiet) Infof(context.Context, string, ...any)  {}
func (quiet) Warnf(context.Context, string, ...any)  {}
func (quiet) Errorf(context.Context, string, ...any) {}
