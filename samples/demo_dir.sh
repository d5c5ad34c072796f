# Sourced by the demo scripts: moves into the demo's own directory, a new temporary one unless
# $DEMO names one (which must not exist yet, or be empty), and says where it is.  Nothing is
# created or deleted in the directory the demo was started from.
if [ -n "${DEMO:-}" ]; then
  if [ -e "$DEMO" ] && [ -n "$(ls -A "$DEMO")" ]; then
    echo "error: DEMO=$DEMO is not empty; name a new directory" >&2
    exit 1
  fi
  mkdir -p "$DEMO"
else
  DEMO="$(mktemp -d "${TMPDIR:-/tmp}/syncpack-demo.XXXXXX")"
fi
DEMO="$(cd "$DEMO" && pwd)"
cd "$DEMO"
say() { printf '\n== %s\n' "$*"; }
echo "demo directory: $DEMO (remove it when done: rm -r $DEMO)"
