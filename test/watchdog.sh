# Sourced by the test drivers. watchdog SECONDS PID...: kills the PIDs with SIGKILL after SECONDS unless
# watchdog_off comes first. Its output goes to /dev/null: a background sleep that kept the driver's stdout open would
# hold the pipe or the $(...) that reads the driver's output (test/run_tests.sh) until it ran out. watchdog_off ends
# it, its sleep included, so that nothing is left behind.
watchdog() {
    local seconds=$1; shift
    ( trap 'kill "$sleeper" 2> /dev/null; exit 0' TERM
      sleep "$seconds" & sleeper=$!
      wait "$sleeper" && kill -KILL "$@" ) > /dev/null 2>&1 &
    WATCHDOG=$!
}
watchdog_off() { kill "$WATCHDOG" 2> /dev/null; wait "$WATCHDOG" 2> /dev/null; }
