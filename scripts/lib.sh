# Shared by the install scripts (sourced, not run): quiet steps that show their whole output
# only when they fail, root for apt-get, and one apt-get update per run.
# The sourcing script sets STEP_PREFIX (its name, for messages) and LOG (a temp file).

# run STEP-NAME CMD...: run CMD with its output captured in $LOG; show it all if CMD fails.
run() {
    local step="$1"
    shift
    if ! "$@" >"$LOG" 2>&1; then
        echo "$STEP_PREFIX: FAILED: $step" >&2
        echo "$STEP_PREFIX: command: $*" >&2
        sed 's/^/    /' "$LOG" >&2
        exit 1
    fi
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "$STEP_PREFIX: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

APT_UPDATED=0
# apt_install PACKAGE...: install Debian packages (apt-get update first, once per run).
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" -eq 0 ]; then
        run "apt-get update" as_root apt-get update -qq
        APT_UPDATED=1
    fi
    run "apt-get install $*" as_root apt-get install -y -qq --no-install-recommends "$@"
}
