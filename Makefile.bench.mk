# The benchmark target, included by the Makefile. Run as root: it creates
# network namespaces (nftr-bench-<pid>-*), starts nftredird and loads
# rules into the namespaces it made; all of it is removed at the end.
#
# The full run takes several minutes and rewrites BENCHMARKS.md and
# docs/bench-latency.svg. BENCH_FLAGS adds flags, e.g.
#   make bench BENCH_FLAGS=-quick                  # seconds; prints, writes nothing
#   make bench BENCH_FLAGS='-pods 50 -cycles 10000'
#   make bench BENCH_FLAGS=-only-cni               # the CNI chains alone; prints, writes nothing
# The program finds bin/nftredird next to itself.
BENCH_FLAGS ?=

bench: deps build
	$(BIN)/nftredir-bench $(BENCH_FLAGS)
