#!/bin/sh
# Prints the -X linker flags that stamp the VCS revision into
# internal/version, for builds the Go toolchain does not stamp itself (a
# linked git worktree). Prints nothing outside a git checkout.
cd "$(dirname "$0")/.." || exit 1
rev=$(git rev-parse HEAD 2>/dev/null) || exit 0
when=$(TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null)
mod=false
[ -n "$(git status --porcelain 2>/dev/null)" ] && mod=true
pkg=github.com/nftredir/nftredir/internal/version
echo "-X $pkg.revision=$rev -X $pkg.revisionTime=$when -X $pkg.modified=$mod"
