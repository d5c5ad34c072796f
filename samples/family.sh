# Sourced by the demo scripts: creates the demo family (boston_hub founds 'parts', adds
# sanfran_hub and bangalore) in the current directory (the demo's own, see demo_dir.sh) and
# makes some local changes at each site.  Expects $SP (the syncpack command) and say() from the
# caller.

# Run by itself, $SP would be empty and the next lines would run the system's 'init'.
: "${SP:?samples/family.sh is sourced by the demo scripts (samples/demo.sh, say); run one of those}"

say "boston_hub founds the family 'parts'; sanfran_hub and bangalore make key pairs and join"
$SP init boston_hub --family parts --site boston_hub
$SP keygen sanfran_hub --site sanfran_hub
$SP keygen bangalore --site bangalore
mkdir usb
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
