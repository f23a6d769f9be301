#!/bin/sh
# Build nsqd and nsqlookupd of the partitioned NSQ fork from the Go module proxy, the way
# nsq_ha/testing/build.py (recipe FORK) does it, minus its source patch:
#
#   * a throwaway module requires the fork at FORK_VERSION plus EXTRA_REQUIRES (reflect2 v1.0.2:
#     older versions crash at start-up on Go >= 1.18), because `go install module@version`
#     refuses modules whose go.mod has replace directives;
#   * the fork's own replace directives are repeated in the throwaway module;
#   * `go build -trimpath -ldflags=-checklinkname=0` (Go >= 1.23 refuses the old //go:linkname
#     pulls of some dependencies without it);
#   * both binaries must report FORK_EXPECTED_VERSION.
#
# No source is patched: build.py lowers nsqd's reservedFDNum (50000 -> 5000) only because the
# test machines cannot raise RLIMIT_NOFILE to 100000; compose.yaml raises it instead.
#
# Usage: build-fork.sh OUTDIR    (settings come from the environment, see the defaults below)
set -eu

out=${1:?usage: build-fork.sh OUTDIR}
: "${FORK_MODULE:=github.com/youzan/nsq}"
: "${FORK_VERSION:?FORK_VERSION is not set}"
: "${FORK_EXPECTED_VERSION:=}"
: "${EXTRA_REQUIRES:=}"
: "${GO_DIRECTIVE:=1.22}"
: "${GO_LDFLAGS:=-checklinkname=0}"
: "${FORK_PROGRAMS:=apps/nsqd apps/nsqlookupd}"

export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
: "${GOTOOLCHAIN:=local}"
export GOTOOLCHAIN

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'module nsqhabuild\n\ngo %s\n' "$GO_DIRECTIVE" >go.mod

go mod download -json "$FORK_MODULE@$FORK_VERSION" >download.json || {
    cat download.json >&2
    echo "build-fork: the Go module proxy did not provide $FORK_MODULE@$FORK_VERSION" >&2
    exit 1
}
gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p' download.json)
[ -n "$gomod" ] && [ -f "$gomod" ] || {
    echo "build-fork: no go.mod for $FORK_MODULE@$FORK_VERSION in: $(cat download.json)" >&2
    exit 1
}

# The fork's replace directives (single-line and block form) as `go mod edit -replace` args.
# A replacement by a local directory cannot be repeated outside the fork's tree: refuse it.
replaces=$(awk '
    function emit(line,    n, f, i, arrow, lhs, rhs) {
        sub(/\/\/.*/, "", line)
        n = split(line, f, " ")
        arrow = 0
        for (i = 1; i <= n; i++) if (f[i] == "=>") arrow = i
        if (n == 0) return
        if (arrow < 2 || arrow > 3 || n - arrow < 1 || n - arrow > 2) {
            print "build-fork: cannot read replace directive: " line > "/dev/stderr"; exit 1
        }
        lhs = f[1]; if (arrow == 3) lhs = lhs "@" f[2]
        rhs = f[arrow + 1]
        if (n - arrow == 1) {
            print "build-fork: local replace " rhs " cannot be repeated" > "/dev/stderr"; exit 1
        }
        rhs = rhs "@" f[arrow + 2]
        print "-replace=" lhs "=" rhs
    }
    /^replace[[:space:]]*\($/ { block = 1; next }
    block && /^\)/ { block = 0; next }
    block { emit($0); next }
    /^replace[[:space:]]/ { sub(/^replace[[:space:]]+/, ""); emit($0) }
' "$gomod")

requires="-require=$FORK_MODULE@$FORK_VERSION"
for req in $EXTRA_REQUIRES; do
    requires="$requires -require=$req"
done
# shellcheck disable=SC2086  # word splitting of the collected arguments is intended
go mod edit $requires $replaces
echo "build-fork: throwaway go.mod:" >&2
cat go.mod >&2

pkgs=
for prog in $FORK_PROGRAMS; do
    pkgs="$pkgs $FORK_MODULE/$prog"
done
mkdir -p "$out"
# shellcheck disable=SC2086
go build -trimpath -ldflags="$GO_LDFLAGS" -o "$out/" $pkgs

for prog in $FORK_PROGRAMS; do
    bin="$out/${prog##*/}"
    printed=$("$bin" --version 2>&1 || true)
    echo "build-fork: $bin --version: $printed" >&2
    if [ -n "$FORK_EXPECTED_VERSION" ]; then
        case $printed in
            *"$FORK_EXPECTED_VERSION"*) ;;
            *)
                echo "build-fork: expected $FORK_EXPECTED_VERSION in that" >&2
                exit 1
                ;;
        esac
    fi
done
