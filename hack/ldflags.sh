#!/bin/sh
# Prints the linker flags of every nftredir build (make build, the image,
# the e2e binaries), so the binaries the tests and the bench run are the
# ones that ship:
#   -s -w   no symbol table or DWARF, a third smaller. Stack traces keep
#           their names (they come from the pclntab) and --version its
#           stamp; a debugger needs a build without them.
#   -X      the VCS revision stamped into internal/version, for builds the
#           Go toolchain does not stamp itself (a linked git worktree);
#           left out outside a git checkout. And the release version, from
#           NFTREDIR_BUILD_VERSION (make's VERSION) when it is set, which
#           --version and the build_info metric then report instead of
#           "(devel)".
cd "$(dirname "$0")/.." || exit 1
pkg=github.com/nftredir/nftredir/internal/version
flags="-s -w"
if rev=$(git rev-parse HEAD 2>/dev/null); then
	when=$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null)
	mod=false
	[ -n "$(git status --porcelain 2>/dev/null)" ] && mod=true
	flags="$flags -X $pkg.revision=$rev -X $pkg.revisionTime=$when -X $pkg.modified=$mod"
fi
if [ -n "${NFTREDIR_BUILD_VERSION:-}" ]; then
	# One word the linker takes as it is, and a Prometheus label value
	# that reads as a version.
	case $NFTREDIR_BUILD_VERSION in
	*[!A-Za-z0-9.+_-]*)
		echo "ldflags: NFTREDIR_BUILD_VERSION=$NFTREDIR_BUILD_VERSION: only letters, digits and . + _ - (e.g. v0.3.0)" >&2
		exit 2
		;;
	esac
	flags="$flags -X $pkg.release=$NFTREDIR_BUILD_VERSION"
fi
echo "$flags"
