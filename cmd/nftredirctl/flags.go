package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nftredir/nftredir/internal/apimode"
	"github.com/nftredir/nftredir/internal/defaults"
	nftredirv1 "github.com/nftredir/nftredir/proto/nftredir/v1"
)

// splitList accepts both repeated flags and comma-separated lists, because
// operators paste lists from manifests where they are comma-separated.
func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// listFlag is a repeatable string flag.
type listFlag struct{ v *[]string }

func (f listFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strings.Join(*f.v, ",")
}

func (f listFlag) Set(s string) error {
	items := splitList(s)
	if len(items) == 0 {
		return fmt.Errorf("empty value")
	}
	*f.v = append(*f.v, items...)
	return nil
}

// portsFlag is a repeatable port-number flag.
type portsFlag struct{ v *[]uint32 }

func (f portsFlag) String() string {
	if f.v == nil {
		return ""
	}
	s := make([]string, len(*f.v))
	for i, p := range *f.v {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ",")
}

func (f portsFlag) Set(s string) error {
	items := splitList(s)
	if len(items) == 0 {
		return fmt.Errorf("empty value")
	}
	for _, it := range items {
		p, err := strconv.ParseUint(it, 10, 16)
		if err != nil || p == 0 {
			return fmt.Errorf("%q is not a port number (1-65535)", it)
		}
		*f.v = append(*f.v, uint32(p))
	}
	return nil
}

// optBoolFlag is a boolean that stays unset (the daemon's default) unless
// given; `--dns-capture` alone means true.
type optBoolFlag struct{ v **bool }

func (f optBoolFlag) String() string {
	if f.v == nil || *f.v == nil {
		return ""
	}
	return strconv.FormatBool(**f.v)
}

func (f optBoolFlag) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	*f.v = &b
	return nil
}

func (f optBoolFlag) IsBoolFlag() bool { return true }

// optStringFlag is a string that stays unset unless given.
type optStringFlag struct{ v **string }

func (f optStringFlag) String() string {
	if f.v == nil || *f.v == nil {
		return ""
	}
	return **f.v
}

func (f optStringFlag) Set(s string) error {
	*f.v = &s
	return nil
}

// modeFlag names capture modes as operators say them.
type modeFlag struct{ v *nftredirv1.CaptureMode }

func (f modeFlag) String() string {
	if f.v == nil || *f.v == nftredirv1.CaptureMode_CAPTURE_MODE_UNSPECIFIED {
		return ""
	}
	return modeName(*f.v)
}

func (f modeFlag) Set(s string) error {
	m, err := apimode.Parse(s)
	if err != nil {
		return fmt.Errorf("%q is not a capture mode: want %s", s, strings.ToLower(defaults.CaptureModeNames()))
	}
	*f.v = m
	return nil
}

// modeName is the mode's name in lower case, "default" when unset, and
// the API's name for a value this build does not know.
func modeName(m nftredirv1.CaptureMode) string {
	mode, set, err := apimode.FromAPI(m)
	switch {
	case err != nil:
		return m.String()
	case !set:
		return "default"
	}
	return strings.ToLower(mode.String())
}

// choiceFlag is a string restricted to a few values.
type choiceFlag struct {
	v       *string
	choices []string
}

func (f choiceFlag) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f choiceFlag) Set(s string) error {
	if !slices.Contains(f.choices, s) {
		return fmt.Errorf("%q is not one of %s", s, strings.Join(f.choices, ", "))
	}
	*f.v = s
	return nil
}
