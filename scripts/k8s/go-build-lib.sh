# Sourced by build-135.sh and build-node.sh (not run): the Go checks and helpers both builds use.
# Expects GO_MIN, NICE, OUT and the functions say/die; takes the module and build cache folders.
#   go_build_env GOMODCACHE GOCACHE
go_build_env() {
  command -v go >/dev/null || die "go $GO_MIN or newer is needed on PATH"
  local gov
  gov=$(go env GOVERSION | sed 's/^go//')
  [ "$(printf '%s\n%s\n' "$GO_MIN" "$gov" | sort -V | head -n1)" = "$GO_MIN" ] || die "go $gov is older than $GO_MIN"
  export GOMODCACHE=$1 GOCACHE=$2 GOTOOLCHAIN=local CGO_ENABLED=0
  export GOFLAGS="-modcacherw -buildvcs=false"
}
gobuild() { nice -n "$NICE" go build -mod=mod -trimpath "$@"; }
timed() {  # name, command...: run, log to $OUT/logs/<name>.log, record the seconds in build-times.txt
  local name=$1 t0=$SECONDS; shift
  mkdir -p "$OUT/logs"
  say "$name: compiling under nice -n $NICE (log: $OUT/logs/$name.log)"
  "$@" >"$OUT/logs/$name.log" 2>&1 || { tail -n 30 "$OUT/logs/$name.log" >&2; die "$name failed (log: $OUT/logs/$name.log)"; }
  printf '%s %ss %s\n' "$name" "$((SECONDS - t0))" "$(date -u +%FT%TZ)" >>"$OUT/build-times.txt"
  say "$name: done in $((SECONDS - t0))s"
}
download() { nice -n "$NICE" go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p'; }
