#!/bin/sh
# Build nsqd and nsqlookupd of the partitioned NSQ fork from its pinned source, the way
# nsq_ha/testing/recipes.py (recipe FORK) does it, minus its source patch:
#
#   * the source is the archive FORK_ARCHIVE (a .tar.gz of the pinned revision, e.g. the
#     project's ../shared/servers/youzan-nsq-b16e68eb.tar.gz, checked against
#     FORK_ARCHIVE_SHA256), or else a git clone of FORK_GIT_URL checked out at FORK_COMMIT;
#     the Go module proxy is not asked for the fork (the one these machines reach refuses it);
#   * a throwaway module requires the fork at FORK_VERSION, replaced by that source folder, plus
#     EXTRA_REQUIRES (reflect2 v1.0.2: older versions crash at start-up on Go >= 1.18), because
#     `go install module@version` refuses modules whose go.mod has replace directives;
#   * the fork's own replace directives are repeated in the throwaway module; the dependencies
#     come from the Go module proxy (GOPROXY, or Go's default);
#   * `go build -trimpath -ldflags=-checklinkname=0` (Go >= 1.23 refuses the old //go:linkname
#     pulls of some dependencies without it);
#   * every binary built must report FORK_EXPECTED_VERSION;
#   * FORK_OPTIONAL_PROGRAMS (e.g. apps/nsqadmin) are built too when the source has every package
#     they import (`go list -deps` succeeds), and skipped with a message otherwise: the
#     project's trimmed source archive holds only what nsqd and nsqlookupd need, a git clone of
#     the same commit holds everything.
#
# No source is patched: build.py lowers nsqd's reservedFDNum (50000 -> 5000) only because the
# test machines cannot raise RLIMIT_NOFILE to 100000; compose.yaml raises it instead.
#
# Usage: build-fork.sh OUTDIR    (settings come from the environment, see the defaults below)
set -eu

out=${1:?usage: build-fork.sh OUTDIR}
: "${FORK_MODULE:=github.com/youzan/nsq}"
: "${FORK_VERSION:?FORK_VERSION is not set}"
: "${FORK_ARCHIVE:=}"
: "${FORK_ARCHIVE_SHA256:=}"
: "${FORK_GIT_URL:=https://github.com/youzan/nsq.git}"
: "${FORK_COMMIT:=}"
: "${FORK_EXPECTED_VERSION:=}"
: "${EXTRA_REQUIRES:=}"
: "${GO_DIRECTIVE:=1.22}"
: "${GO_LDFLAGS:=-checklinkname=0}"
: "${FORK_PROGRAMS:=apps/nsqd apps/nsqlookupd}"
: "${FORK_OPTIONAL_PROGRAMS:=}"

export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
: "${GOTOOLCHAIN:=local}"
export GOTOOLCHAIN

case $out in
    /*) ;;
    *) out=$(pwd)/$out ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# -- the pinned source, into $work/src ---------------------------------------------------------
if [ -n "$FORK_ARCHIVE" ]; then
    [ -f "$FORK_ARCHIVE" ] || {
        echo "build-fork: FORK_ARCHIVE=$FORK_ARCHIVE is not a file" >&2
        exit 1
    }
    [ -n "$FORK_ARCHIVE_SHA256" ] || {
        echo "build-fork: FORK_ARCHIVE_SHA256 is not set" >&2
        exit 1
    }
    got=$(sha256sum "$FORK_ARCHIVE" | cut -d' ' -f1)
    [ "$got" = "$FORK_ARCHIVE_SHA256" ] || {
        echo "build-fork: $FORK_ARCHIVE has sha256 $got, expected $FORK_ARCHIVE_SHA256" >&2
        exit 1
    }
    mkdir "$work/unpacked"
    tar -xzf "$FORK_ARCHIVE" -C "$work/unpacked" --no-same-owner
    if [ -f "$work/unpacked/go.mod" ]; then
        mv "$work/unpacked" "$work/src"
    else
        set -- "$work"/unpacked/*/go.mod
        [ $# -eq 1 ] && [ -f "$1" ] || {
            echo "build-fork: $FORK_ARCHIVE has no go.mod in its one top folder" >&2
            exit 1
        }
        mv "${1%/go.mod}" "$work/src"
    fi
    echo "build-fork: source: $FORK_ARCHIVE (sha256 $got)" >&2
else
    [ -n "$FORK_COMMIT" ] || {
        echo "build-fork: set FORK_ARCHIVE (a source .tar.gz) or FORK_COMMIT (to clone)" >&2
        exit 1
    }
    git init -q "$work/src"
    git -C "$work/src" fetch -q --depth 1 "$FORK_GIT_URL" "$FORK_COMMIT"
    git -C "$work/src" checkout -q FETCH_HEAD
    head=$(git -C "$work/src" rev-parse HEAD)
    [ "$head" = "$FORK_COMMIT" ] || {
        echo "build-fork: $FORK_GIT_URL gave $head, expected $FORK_COMMIT" >&2
        exit 1
    }
    echo "build-fork: source: $FORK_GIT_URL at $head" >&2
fi
module=$(sed -n 's/^module[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' "$work/src/go.mod")
[ "$module" = "$FORK_MODULE" ] || {
    echo "build-fork: the source is module '$module', not '$FORK_MODULE'" >&2
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
' "$work/src/go.mod")

cd "$work"
printf 'module nsqhabuild\n\ngo %s\n' "$GO_DIRECTIVE" >go.mod
requires="-require=$FORK_MODULE@$FORK_VERSION"
for req in $EXTRA_REQUIRES; do
    requires="$requires -require=$req"
done
# shellcheck disable=SC2086  # word splitting of the collected arguments is intended
go mod edit $requires $replaces "-replace=$FORK_MODULE=./src"
echo "build-fork: throwaway go.mod:" >&2
cat go.mod >&2

programs=$FORK_PROGRAMS
for prog in $FORK_OPTIONAL_PROGRAMS; do
    if missing=$(go list -deps "$FORK_MODULE/$prog" 2>&1 >/dev/null); then
        programs="$programs $prog"
    else
        echo "build-fork: skipping optional $prog: the source lacks what it imports:" >&2
        printf '%s\n' "$missing" | head -n 5 >&2
    fi
done
pkgs=
for prog in $programs; do
    pkgs="$pkgs $FORK_MODULE/$prog"
done
mkdir -p "$out"
# shellcheck disable=SC2086
go build -trimpath -ldflags="$GO_LDFLAGS" -o "$out/" $pkgs

for prog in $programs; do
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
