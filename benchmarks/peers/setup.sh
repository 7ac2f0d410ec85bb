#!/usr/bin/env bash
# Install the peer CTR libraries, each in its own virtual environment under .peers/<name>/, never as
# opengem dependencies. CPU torch goes in first and stays pinned by a constraint file, so pip can never
# swap in a CUDA torch (or pull nvidia-* wheels) to satisfy a peer; a peer that insists on another torch
# fails to resolve and is recorded as skipped in .peers/<name>/SKIPPED with pip's reason.
#
#   bash benchmarks/peers/setup.sh            # all peers
#   bash benchmarks/peers/setup.sh fuxictr    # just some
set -u
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3.11}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0+cpu}
ROOT=.peers
mkdir -p "$ROOT"

# name -> pip requirement(s) of the peer
declare -A PEERS=(
  [fuxictr]="fuxictr==2.3.10"
  [torch-rechub]="torch-rechub==0.9.0"
  [deepctr-torch]="deepctr-torch==0.3.0"
)
# extra packages each peer's runner needs that the peer may not declare
declare -A EXTRAS=(
  [fuxictr]="pandas pyarrow scikit-learn"
  [torch-rechub]="pandas pyarrow scikit-learn"
  [deepctr-torch]="pandas pyarrow scikit-learn requests"  # deepctr_torch imports requests without declaring it
)

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(fuxictr torch-rechub deepctr-torch)

status=0
for name in "${names[@]}"; do
  req=${PEERS[$name]:-}
  if [ -z "$req" ]; then echo "unknown peer $name (known: ${!PEERS[*]})"; status=1; continue; fi
  venv=$ROOT/$name
  log=$venv.install.log
  rm -f "$venv/SKIPPED" "$venv/READY"
  echo "== $name: $req  (log: $log)"
  (
    set -e
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    "$venv/bin/python" -m pip install -q "$TORCH_SPEC"
    "$venv/bin/python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
      > "$venv/constraints.info"
    ver=$("$venv/bin/python" -c "import torch; print(torch.__version__)")
    echo "torch==$ver" > "$venv/constraints.txt"
    "$venv/bin/python" -m pip install -q -c "$venv/constraints.txt" $req ${EXTRAS[$name]}
    "$venv/bin/python" - <<'PY'
import importlib.metadata as md
import torch
bad = [d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia-")]
assert torch.version.cuda is None, f"a CUDA torch got in: {torch.__version__}"
assert not bad, f"CUDA wheels got in: {bad}"
PY
  ) > "$log" 2>&1
  if [ $? -eq 0 ]; then
    "$venv/bin/python" -m pip freeze 2>/dev/null | grep -iE "^(torch|fuxictr|torch-rechub|torch_rechub|deepctr-torch|deepctr_torch)=" \
      > "$venv/READY"
    echo "   ready: $(tr '\n' ' ' < "$venv/READY")"
  else
    tail -n 15 "$log" > "$venv/SKIPPED" 2>/dev/null || { mkdir -p "$venv"; tail -n 15 "$log" > "$venv/SKIPPED"; }
    echo "   skipped: $(grep -iE 'error|conflict|requires' "$venv/SKIPPED" | head -n 3)"
    status=0  # a peer that cannot be installed is reported, not fatal
  fi
done
exit $status
