#!/usr/bin/env bash
# A demo family: boston_hub, sanfran_hub and bangalore, synchronised through a directory that
# stands in for a USB stick.  Run from anywhere; everything goes under $DEMO (default ./demo).
set -euo pipefail
DEMO="${DEMO:-demo}"
SP="${SYNCPACK:-syncpack}"
rm -rf "$DEMO"
mkdir -p "$DEMO"
cd "$DEMO"
say() { printf '\n== %s\n' "$*"; }

say "boston_hub founds the family 'parts'"
$SP init boston_hub --family parts --site boston_hub
say "sanfran_hub and bangalore make their key pairs; boston_hub adds them"
$SP keygen sanfran_hub --site sanfran_hub
$SP keygen bangalore --site bangalore
$SP --site boston_hub mkreplica export --site sanfran_hub \
    --pubkey sanfran_hub/keys/site.pub --out usb --priority 2
$SP --site sanfran_hub mkreplica import usb
$SP --site boston_hub mkreplica export --site bangalore \
    --pubkey bangalore/keys/site.pub --out usb --priority 1
$SP --site bangalore mkreplica import usb
rm -rf usb

say "each site works on its own"
for i in $(seq 1 20); do
  echo "{\"collection\": \"parts\", \"key\": \"b-$i\", \"value\": {\"qty\": $i, \"site\": \"boston\"}}"
done > boston.jsonl
$SP --site boston_hub load boston.jsonl
$SP --site sanfran_hub put parts s-1 '{"qty": 7, "site": "sanfran"}'
$SP --site sanfran_hub put parts b-3 '{"qty": 300, "site": "sanfran"}'
$SP --site bangalore put parts g-1 '{"qty": 1, "site": "bangalore"}'
$SP --site bangalore delete parts b-5

say "round 1: every site exports to every other onto the stick; the stick travels; imports"
for s in boston_hub sanfran_hub bangalore; do $SP --site $s export --all --out usb; done
for s in boston_hub sanfran_hub bangalore; do $SP --site $s import usb; done
rm -rf usb
say "round 2: acknowledgements and relayed changes"
for s in boston_hub sanfran_hub bangalore; do $SP --site $s export --all --out usb; done
for s in boston_hub sanfran_hub bangalore; do $SP --site $s import usb; done
rm -rf usb

say "the epoch matrix at boston_hub"
$SP --site boston_hub lsepoch
say "conflicts (b-3 was written at boston and sanfran concurrently; lww keeps both visible here)"
$SP --site boston_hub conflicts
say "digests: equal on every site means converged"
for s in boston_hub sanfran_hub bangalore; do
  printf '%-12s %s\n' "$s" "$($SP --site $s digest)"
done
a=$($SP --site boston_hub digest); b=$($SP --site sanfran_hub digest); c=$($SP --site bangalore digest)
if [ "$a" = "$b" ] && [ "$b" = "$c" ]; then echo "converged"; else echo "NOT converged" >&2; exit 1; fi
