# Sourced by run.sh and sensitivity/run.sh: EXP and REPORT from $1, a build folder (build/release) or a folder
# holding the binaries side by side (an installed copy).
if [ -x "$1/fl-experiment" ]; then EXP="$1/fl-experiment"; REPORT="$1/fl-report"
else EXP="$1/experiments/fl-experiment"; REPORT="$1/report/fl-report"; fi
