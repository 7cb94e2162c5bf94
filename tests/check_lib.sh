# check_lib.sh — sourced by the shell tests: the counts of the checks passed
# and failed, and the script's end, whose status is 0 only when none failed
# and at least one passed (a script whose checks never ran fails).
pass=0
fail=0
ok() { # [WHAT]: one check passed (WHAT printed when given)
  pass=$((pass + 1))
  if [ $# -gt 0 ]; then echo "ok   $*"; fi
}
bad() { # WHY: one check failed
  fail=$((fail + 1))
  echo "FAIL: $*" >&2
}
finish() { # [NAME]: "NAME: P passed, F failed" and the status
  echo "${1:+$1: }$pass passed, $fail failed"
  [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
}
