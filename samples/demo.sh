#!/usr/bin/env bash
# A demo family: boston_hub, sanfran_hub and bangalore, synchronised through a directory that
# stands in for a USB stick.  Run from anywhere: everything goes into a new temporary directory
# (or $DEMO, which must not exist yet or be empty); the directory it is started from is left
# alone.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SP="${SYNCPACK:-syncpack}"
source "$HERE/demo_dir.sh"

source "$HERE/family.sh"

say "round 1: every site exports to every other onto the stick; the stick travels; imports"
mkdir usb
for s in boston_hub sanfran_hub bangalore; do $SP --site $s export --all --out usb; done
for s in boston_hub sanfran_hub bangalore; do $SP --site $s import usb; done
rm -rf usb
say "round 2: acknowledgements and relayed changes"
mkdir usb
for s in boston_hub sanfran_hub bangalore; do $SP --site $s export --all --out usb; done
for s in boston_hub sanfran_hub bangalore; do $SP --site $s import usb; done
rm -rf usb

say "the epoch matrix at boston_hub"
$SP --site boston_hub lsepoch
say "conflicts (b-3 was written at boston and sanfran concurrently; lww keeps both and shows the newest, marked *)"
$SP --site boston_hub conflicts
say "digests: equal on every site means converged"
for s in boston_hub sanfran_hub bangalore; do
  printf '%-12s %s\n' "$s" "$($SP --site $s digest)"
done
a=$($SP --site boston_hub digest); b=$($SP --site sanfran_hub digest); c=$($SP --site bangalore digest)
if [ "$a" = "$b" ] && [ "$b" = "$c" ]; then echo "converged"; else echo "NOT converged" >&2; exit 1; fi
