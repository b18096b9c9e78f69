# The benchmark target, included by the Makefile. Run as root: it creates
# network namespaces (nftr-bench-<pid>-*), starts nftredird and loads
# rules into the namespaces it made; all of it is removed at the end.
#
# The full run takes several minutes and rewrites BENCHMARKS.md and
# docs/bench-latency.svg. BENCH_FLAGS adds flags, e.g.
#   make bench BENCH_FLAGS=-quick                  # seconds; prints, writes nothing
#   make bench BENCH_FLAGS='-pods 50 -cycles 10000'
#   make bench BENCH_FLAGS=-only-cni               # the CNI chains alone; prints, writes nothing
#   make bench BENCH_FLAGS=-only-podstart          # pod start through the real cluster alone; prints, writes nothing
# BASELINE names an earlier nftredird binary, measured beside this build
# with the same AddPod and RemovePod samples (a refactor's A/B):
#   make bench BASELINE=/tmp/nftredird-old                             # the full run, with the A/B table
#   make bench BASELINE=/tmp/nftredird-old BENCH_FLAGS='-only-baseline -reps 9'  # the A/B alone; prints, writes nothing
# The report calls a difference resolved only when equal builds would
# rarely give it (report_baseline.go), which 3 repetitions never do.
# BASELINE_CNI names an earlier nftredir-cni binary, whose bare exec the
# pod start section times turn about with this build's:
#   make bench BASELINE_CNI=/tmp/nftredir-cni-old BENCH_FLAGS=-only-podstart
# The program finds bin/nftredird next to itself. Its pod start section
# runs the project's single-node cluster (internal/kcluster, so the
# Kubernetes binaries of deps-k8s), with stock ztunnel and istiod as the
# node proxy when ZTUNNEL_BIN is set (deps-istio), else a stand-in; hold
# the machine's heavy lock around it where others share the machine:
#   flock /tmp/nftredir-heavy.lock make bench
BENCH_FLAGS ?=
BASELINE ?=
BASELINE_CNI ?=

bench: $(if $(ZTUNNEL_BIN),deps-istio,deps-k8s) build
	$(BIN)/nftredir-bench $(if $(BASELINE),-baseline-daemon $(BASELINE)) $(if $(BASELINE_CNI),-baseline-cni $(BASELINE_CNI)) $(BENCH_FLAGS)
