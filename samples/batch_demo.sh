#!/usr/bin/env bash
# Scheduled rounds: the demo family of samples/demo.sh (boston_hub, sanfran_hub, bangalore)
# synchronised by 'syncpack batch' alone, through a shared "media" directory that stands in for
# a drop directory or a medium that travels.  Two rounds at every site, then equal digests.
# Run from anywhere: everything goes into a new temporary directory (or $DEMO, which must not
# exist yet or be empty); the directory it is started from is left alone.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SP="${SYNCPACK:-syncpack}"
source "$HERE/demo_dir.sh"

SP="$SP -q" source "$HERE/family.sh"

say "the batch configs (samples/batch/*.toml), the shared media directory, a log directory"
mkdir -p batch media logs
cp "$HERE"/batch/boston_hub.toml "$HERE"/batch/sanfran_hub.toml "$HERE"/batch/bangalore.toml batch/
ls batch

for round in 1 2; do
  say "round $round: one 'syncpack batch' per site (what cron or the systemd timer runs)"
  for s in boston_hub sanfran_hub bangalore; do
    $SP batch "batch/$s.toml"
  done
done

say "what is left on the media (bangalore keeps its packets: remove_after_import is off there)"
(cd media && find . -name '*.spk' | sort)
say "boston_hub's batch log"
cat boston_hub/batch.log
say "one more round at bangalore, as a scheduler sees it (--json, exit code)"
$SP --json batch batch/bangalore.toml | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("outcome", d["outcome"], "exit", d["exit_code"], "counts", d["counts"])'

say "digests: equal on every site means converged"
for s in boston_hub sanfran_hub bangalore; do
  printf '%-12s %s\n' "$s" "$($SP --site $s digest)"
  $SP -q --site $s fsck
done
a=$($SP --site boston_hub digest); b=$($SP --site sanfran_hub digest); c=$($SP --site bangalore digest)
if [ "$a" = "$b" ] && [ "$b" = "$c" ]; then echo "converged"; else echo "NOT converged" >&2; exit 1; fi
