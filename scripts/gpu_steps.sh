# Sourced by the before-and-after GPU scripts (gpu_decode_step.sh, gpu_static_step.sh): their common setup and `step`.
# Sets OUT, PREV, dir=$OUT/$1 and status; `step NAME SECONDS ROOT CMD...` runs CMD in ROOT (this checkout or PREV)
# with a time limit, logs it to $dir/NAME.log, shows its last lines (FILTER: a grep -E -v pattern of lines to hide;
# default: blank lines) and remembers a failure in status.
OUT=$(realpath -m "${OUT:-out}")
PREV=${PREV:-}
export PYTHONUNBUFFERED=1
dir=$OUT/$1
mkdir -p "$dir"
status=0
step() {
  local name=$1 limit=$2 root=$3
  shift 3
  echo "=== $name ($root): $*"
  local began=$SECONDS
  (cd "$root" && PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout "$limit" "$@") 2>&1 | tee "$dir/$name.log" \
    | grep -E -v "${FILTER:-^$}" | tail -40
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc, $((SECONDS - began)) s"
  [[ $rc == 0 ]] || status=1
}
