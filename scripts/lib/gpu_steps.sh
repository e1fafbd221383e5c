# Shared step runners of the one-command GPU scripts (scripts/*_gpu.sh); source after `cd` to the
# repository root. Each runs CMD under `timeout`, its output to a log file.
#
#   budget_step NAME LIMIT LOG CMD...   the limit is cut to what is left of $BUDGET seconds since
#                                       $START (both set by the caller); with < 15 s left the step is
#                                       skipped (return 125, "SKIPPED (time budget)" in LOG); prints
#                                       "=== NAME" and the last $STEP_TAIL (default 40) lines of LOG.
#   row_step NAME LIMIT LOG CMD...      LOG is relative to $OUT; appends "NAME | status | seconds | LOG"
#                                       to the caller's array `rows` (status OK / TIMEOUT / FAIL (rc N)).
# Both return CMD's exit status (124: timeout).

budget_step() {
  local name=$1 limit=$2 log=$3; shift 3
  local rest=$((BUDGET - ($(date +%s) - START)))
  [ "$rest" -lt "$limit" ] && limit=$rest
  if [ "$limit" -lt 15 ]; then echo "=== $name: SKIPPED (time budget)"; echo "SKIPPED (time budget)" > "$log"; return 125; fi
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s)"
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  tail -n "${STEP_TAIL:-40}" "$log"
  [ $rc -eq 124 ] && echo "  TIMEOUT after ${limit}s"
  return $rc
}

row_step() {
  local name=$1 limit=$2 log=$3; shift 3
  local t0 rc status
  t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$log" 2>&1; rc=$?
  status=OK; [ $rc = 124 ] && status="TIMEOUT (${limit}s)"; [ $rc != 0 ] && [ $rc != 124 ] && status="FAIL (rc $rc)"
  rows+=("$name | $status | $(( $(date +%s) - t0 )) s | $log")
  return $rc
}
