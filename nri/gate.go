package nri

import (
	"fmt"
	"strconv"
	"strings"
)

// Gate is what a runtime offers to keep a pod's containers from running
// while nftredird has not handled its sandbox. NRI itself is fail-open:
// with no plugin connected, or a plugin that times out or drops the
// connection, the runtime starts the pod anyway. Only these close it.
type Gate struct {
	Runtime, Version string
	// NRIVersion is the NRI library the runtime says it uses; "" or
	// "unknown" when it does not say.
	NRIVersion string
	// Validator: the runtime has the default validator, which rejects a
	// container at creation while a plugin listed in its required_plugins
	// is not registered (containerd 2.2, CRI-O 1.34).
	Validator bool
	// FailurePolicy: the runtime's NRI honours a plugin's failure policy
	// (NRI 0.12.4), so a RunPodSandbox that times out fails the sandbox
	// instead of letting it proceed.
	FailurePolicy bool
}

// First releases with the default validator.
var (
	containerdValidator = version{2, 2, 0, false}
	crioValidator       = version{1, 34, 0, false}
	failurePolicyNRI    = version{0, 12, 4, false}
)

// GateOf tells, from what the runtime says of itself at NRI's Configure,
// which gate it offers.
func GateOf(runtime, runtimeVersion, nriVersion string) Gate {
	g := Gate{Runtime: runtime, Version: runtimeVersion, NRIVersion: nriVersion}
	v, ok := parseVersion(runtimeVersion)
	switch {
	case !ok:
	case runtime == "containerd":
		g.Validator = !v.less(containerdValidator)
	case runtime == "cri-o" || runtime == "CRI-O":
		g.Validator = !v.less(crioValidator)
	}
	if nv, ok := parseVersion(nriVersion); ok {
		g.FailurePolicy = !nv.less(failurePolicyNRI)
	}
	return g
}

// FailClosed reports whether NRI enrolment on this runtime can keep a
// mesh pod from running uncaptured, and why not when it cannot. Without
// the validator nothing stops a pod while the plugin is away; the
// failure policy alone does not cover a plugin that is down.
func (g Gate) FailClosed() (bool, string) {
	if g.Validator {
		return true, ""
	}
	return false, fmt.Sprintf("%s %s has no NRI validator with required plugins (containerd 2.2 and CRI-O 1.34 have one): a pod would start uncaptured whenever nftredird is not connected", orUnknown(g.Runtime), orUnknown(g.Version))
}

// String says which guarantees hold, for logs and readiness.
func (g Gate) String() string {
	s := fmt.Sprintf("%s %s (NRI %s): ", orUnknown(g.Runtime), orUnknown(g.Version), orUnknown(g.NRIVersion))
	switch {
	case g.Validator && g.FailurePolicy:
		return s + "validator and failure policy: a pod waits while nftredird is away, and a timed-out RunPodSandbox fails the sandbox"
	case g.Validator:
		return s + "validator, no failure policy: a pod waits while nftredird is away; a timed-out RunPodSandbox lets the sandbox run but disconnects nftredird, so its containers wait"
	case g.FailurePolicy:
		return s + "failure policy, no validator: fail-open while nftredird is away"
	}
	return s + "neither validator nor failure policy: fail-open"
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// version is a release number; pre is set for a pre-release (v2.2.0-rc.1),
// which comes before its release.
type version struct {
	major, minor, patch int
	pre                 bool
}

func (a version) less(b version) bool {
	switch {
	case a.major != b.major:
		return a.major < b.major
	case a.minor != b.minor:
		return a.minor < b.minor
	case a.patch != b.patch:
		return a.patch < b.patch
	}
	return a.pre && !b.pre
}

// parseVersion reads "v2.4.2", "2.4.2", "1.34", "v2.2.0-rc.1" and
// "2.4.2+unknown" (a build without version stamp); anything else is not a
// version.
func parseVersion(s string) (version, bool) {
	s = strings.TrimPrefix(s, "v")
	var v version
	if i := strings.IndexAny(s, "-+"); i >= 0 {
		v.pre = s[i] == '-'
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return version{}, false
	}
	nums := []*int{&v.major, &v.minor, &v.patch}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return version{}, false
		}
		*nums[i] = n
	}
	return v, true
}
