# Helpers of the side-by-side scripts (compare-*.sh, efa-vs-udp.sh):
# sourced, not run. `prog` names the script in error messages.

# A size as the apps take it (4k, 1m: binary suffixes) in bytes; a bad
# one ends the script with status 2, naming -S.
to_bytes() {
  local n="${1%[kKmMgG]}" shift=0
  case "$1" in
    *[kK]) shift=10 ;; *[mM]) shift=20 ;; *[gG]) shift=30 ;;
  esac
  if ! [[ "$n" =~ ^[0-9]+$ ]]; then
    echo "$prog: -S: \`$1\` is not a size" >&2
    exit 2
  fi
  echo $((n << shift))
}

# The p-th quantile (0.25, 0.5, 0.75) of the numbers on stdin, separated
# by spaces or newlines: linear between the two nearest ranks.
quantile() {
  tr ' ' '\n' | grep -v '^$' | sort -g | awk -v p="$1" '{ v[NR] = $1 } END {
    h = (NR - 1) * p + 1; lo = int(h); f = h - lo
    if (f == 0 || lo >= NR) print v[lo]; else print v[lo] + f * (v[lo + 1] - v[lo]) }'
}

# The median of the numbers on stdin (the mean of the middle two of an
# even count).
median() {
  quantile 0.5
}

# -r's value ($1): a count of at least 5, else the script ends with
# status 2. $2 names what is counted (default: runs).
check_runs() {
  if ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 5 ]; then
    echo "$prog: -r $1: medians need at least 5 ${2:-runs}" >&2
    exit 2
  fi
}

# A scratch directory in `tmp`, removed when the script exits.
make_tmp() {
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
}

# Writes FILE, a Bencher Metric Format object, from the entries after it
# (each one or more `"name": {...}` lines, without the trailing comma).
write_bmf() {
  local file=$1
  shift
  {
    echo "{"
    local e i=0
    for e in "$@"; do
      i=$((i + 1))
      if [ "$i" -lt "$#" ]; then echo "$e,"; else echo "$e"; fi
    done
    echo "}"
  } >"$file"
}

# Builds `efapoll` as N binaries that differ only in where its functions
# lie: the release build's one LTO object, linked by lld N times with its
# code sections in an order shuffled by seeds 1..N. A rate that moves
# by a few percent with the code's placement (alignment, the branch
# predictors' and the decoded-instruction cache's sets) is one draw of
# that placement in any one build; run on each of these, it is measured
# over N. Writes the binaries as DIR/efapoll-1..N; ends the script with
# status 1 if the build or a link fails. Needs ld.lld.
build_layouts() {
  local n=$1 dir=$2 target="${CARGO_TARGET_DIR:-target}/layouts"
  local line="$target/link-line"
  # The object is kept (-C save-temps), and the link line rustc prints
  # when it links; a build that was up to date prints none, so the line
  # of the last one is kept beside it.
  local build=(cargo rustc --release --quiet -p efapoll-apps --bin efapoll --
    -C save-temps --print link-args -C link-arg=-fuse-ld=lld)
  if ! CARGO_TARGET_DIR="$target" "${build[@]}" >"$dir/build.out" 2>&1; then
    cat "$dir/build.out" >&2
    exit 1
  fi
  if grep -q '^LC_ALL=' "$dir/build.out"; then
    grep '^LC_ALL=' "$dir/build.out" | tail -1 >"$line"
  elif ! [ -s "$line" ]; then
    # Up to date, its line lost: linked again.
    CARGO_TARGET_DIR="$target" cargo clean --release --quiet -p efapoll-apps
    CARGO_TARGET_DIR="$target" "${build[@]}" >"$dir/build.out" 2>&1 || {
      cat "$dir/build.out" >&2
      exit 1
    }
    grep '^LC_ALL=' "$dir/build.out" | tail -1 >"$line" || true
  fi
  if ! [ -s "$line" ]; then
    echo "$prog: rustc printed no link line to link the layouts with (--print link-args)" >&2
    exit 1
  fi
  local i cmd
  for i in $(seq "$n"); do
    # The line is rustc's own, shell-quoted: its output renamed, the
    # shuffle added.
    cmd="$(sed -E 's#"-o" "[^"]+"#"-o" "'"$dir/efapoll-$i"'"#' "$line")"
    if ! eval "$cmd \"-Wl,--shuffle-sections=.text.*=$i\"" >"$dir/link.out" 2>&1; then
      echo "$prog: linking layout $i failed:" >&2
      cat "$dir/link.out" >&2
      exit 1
    fi
  done
}
