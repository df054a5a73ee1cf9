# shellcheck shell=sh
# Runs on the host with POSIX sh, sent as text by hosts.base.write_atomic_argv: writes its stdin to
# PATH whole or not at all, into PATH.part and then renamed over PATH (PATH's folder made first).
# Arguments: PRIVATE PATH; PRIVATE 1: the file is readable by the user alone (umask 077).
mkdir -p "$(dirname "$2")" || exit
if [ "$1" = 1 ]; then umask 077; fi
cat > "$2.part" && mv -f "$2.part" "$2"
