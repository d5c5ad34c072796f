#!/usr/bin/env bash
# Three sites each run a small shop application (samples/attach_app.py) that writes plain SQL
# into its own SQLite file; syncpack replicates the shop's tables through a directory standing
# in for a USB stick, and the three shops end with equal tables.  See docs/attach.md.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/demo_dir.sh"
APP="python3 $HERE/attach_app.py"

round() {
  for a in boston sanfran bangalore; do
    syncpack -q --site "$a" export --all --out "usb/$a" --create-out >/dev/null
    for b in boston sanfran bangalore; do
      [ "$a" = "$b" ] || syncpack -q --site "$b" import "usb/$a"
    done
  done
}

say "a family of three sites"
syncpack init boston --family shops --site boston >/dev/null
for s in sanfran bangalore; do
  syncpack keygen "$s" --site "$s" >/dev/null
  syncpack --site boston mkreplica export --site "$s" --pubkey "$s/keys/site.pub" \
    --out "usb/new-$s" --create-out >/dev/null 2>&1
  syncpack --site "$s" mkreplica import "usb/new-$s" >/dev/null 2>&1
done

say "boston's shop has data before syncpack; the tables are attached"
$APP boston.db init
$APP boston.db restock bolt 100
$APP boston.db order boston 3
syncpack --site boston attach boston.db --table stock --table orders
for s in sanfran bangalore; do
  $APP "$s.db" init                    # an empty shop: the first round fills its tables
  syncpack --site "$s" attach "$s.db" --table stock --table orders
done


say "a first round: the new shops receive boston's stock and orders"
round

say "each shop takes orders on its own, offline"
$APP boston.db order boston 2 &
$APP sanfran.db order sanfran 4 &
$APP bangalore.db order bangalore 1 &
wait
round

say "more orders, then two rounds of carrying the stick"
$APP sanfran.db restock nut 50
$APP bangalore.db order bangalore 2
round
round

say "each shop's tables"
for s in boston sanfran bangalore; do
  $APP "$s.db" show > "$s.txt"
  syncpack -q --site "$s" fsck
done
cat boston.txt
if cmp -s boston.txt sanfran.txt && cmp -s boston.txt bangalore.txt; then
  echo "converged: the three shops hold equal tables"
else
  echo "NOT converged" >&2
  exit 1
fi
say "bolt's stock: the shops' first orders updated it at once, a conflict that lww decided
   (the newest update kept) and that bangalore's later order, made after it had seen them
   all, settled. A counter kept per shop (a row each, summed) would count every order."
syncpack --site boston conflicts
