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
