#!/usr/bin/env bash
# Print the path of a working Python X.Y interpreter (its own sys.executable), for `make test`'s
# extra interpreters: `python3.12` on PATH if it runs and is 3.12 (a pyenv shim for a version
# that is not selected is on PATH but exits 127), else pyenv's newest
# $(pyenv root)/versions/3.12*/bin/python3.12.  Nothing found: a message saying what was tried and
# how to get one, and exit 1, so CI fails instead of skipping that interpreter.
set -euo pipefail

want="${1:-}"
if ! [[ "$want" =~ ^3\.[0-9]+$ ]]; then
  echo "usage: tools/find_python.sh X.Y (for example 3.12)" >&2
  exit 2
fi
exe="python$want"
tried=()

# The interpreter's own path when $1 runs and is Python $want; otherwise a note in `tried`.
check() {
  local out
  if out=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2], sys.executable)' 2>&1); then
    if [ "${out%% *}" = "$want" ] && [ -x "${out#* }" ]; then
      echo "${out#* }"
      return 0
    fi
    tried+=("$1 (is Python ${out%% *})")
  else
    tried+=("$1 ($(printf '%s' "$out" | head -n 1))")
  fi
  return 1
}

if on_path=$(command -v "$exe"); then
  check "$on_path" && exit 0
else
  tried+=("$exe on PATH (not there)")
fi

if [ -n "${PYENV_ROOT:-}" ]; then
  root="$PYENV_ROOT"
elif command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root)
else
  root=~/.pyenv  # tilde expansion falls back to the password database when HOME is unset
fi
found=0
while IFS= read -r candidate; do
  [ -n "$candidate" ] || continue
  found=1
  check "$candidate" && exit 0
done < <(compgen -G "$root/versions/$want*/bin/$exe" | sort -r -V)
[ "$found" -eq 1 ] || tried+=("$root/versions/$want*/bin/$exe (none)")

{
  echo "tools/find_python.sh: no working Python $want; tried:"
  printf '  %s\n' "${tried[@]}"
  echo "Install it (pyenv install $want) or put a $exe that runs on PATH."
} >&2
exit 1
