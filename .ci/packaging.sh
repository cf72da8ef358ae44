#!/usr/bin/env bash
# The wheel, installed with no checkout on the path, run from the clone's root and elsewhere.
set -euo pipefail
ROOT=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$ROOT"
before=$(git status --porcelain=v1 --untracked-files=all)

python -m pip wheel --no-deps -q -w "$WORK/dist" .
python -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "$WORK"/dist/opcompiler-*.whl 2>&1 | grep -v "^WARNING: Location" || true
OPC="$WORK/venv/bin/opcompiler"
PY="$WORK/venv/bin/python"
export OPC_LOG_DIR="$WORK/logs"   # the user's records: somewhere of their own

check_tune() {  # $1 = where, then the command; asserts a verified result with 0 invalid trials
  local where=$1; shift
  (cd "$where" && "$@" --json) > "$WORK/out.json"
  "$PY" - "$WORK/out.json" "$where" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["invalid"] == 0, f"{s['invalid']} invalid trials from {sys.argv[2]}"
assert s["new_trials"] > 0 and s["verified"], s
assert s["log"].startswith(__import__("os").environ["OPC_LOG_DIR"]), s["log"]
print(f"  from {sys.argv[2]}: {s['new_trials']} new trials, 0 invalid, best {s.get('best_cycles') or s['best_seconds']}")
PY
}

# the README's main command, from the clone's root and from another directory
check_tune "$ROOT" "$OPC" tune conv2d --target ascend-sim
rm -rf "$OPC_LOG_DIR"
mkdir -p "$WORK/elsewhere"
check_tune "$WORK/elsewhere" "$OPC" tune conv2d --target ascend-sim
# python -m from the root, and a short tune with two worker processes from the root
(cd "$ROOT" && "$PY" -m opcompiler targets > /dev/null)
echo "  python -m opcompiler targets from the root: ok"
check_tune "$ROOT" "$OPC" tune matmul --target dsp-sim --preset seed.matmul_16x256x1024 --trials 16 --workers 2

after=$(git status --porcelain=v1 --untracked-files=all)
if [ "$before" != "$after" ]; then
  echo "the runs changed the checkout:"; diff <(echo "$before") <(echo "$after") || true; exit 1
fi
echo "  git status unchanged"
