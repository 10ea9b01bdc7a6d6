#!/usr/bin/env bash
# Two training scripts in two processes sharing one GPU through salusd: starts a salusd of its own
# (simulated GPU where there is none), runs both scripts at once, prints its status while they
# run, and stops it. From the repository root, after scripts/setup.sh:
#   examples/two_processes/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-$here/../../.venv/bin/python}
salusd=${SALUSD:-$(dirname "$py")/salusd}
export SALUS_SOCKET=$(mktemp -u /tmp/salusd-example-XXXXXX.sock)
"$salusd" --socket "$SALUS_SOCKET" --memory 2GiB --policy fair --log-level warn &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [[ -S $SALUS_SOCKET ]] && break; sleep 0.05; done
"$py" "$here/train_cnn.py" &
cnn=$!
"$py" "$here/train_lstm.py" &
lstm=$!
sleep 6  # both scripts have imported torch and are training by now
"$salusd" --socket "$SALUS_SOCKET" --status || true
# Each script's exit status counts; one that fails does not stop the other (nor its daemon).
status=0
wait $cnn || { status=$?; echo "train_cnn.py failed ($status)" >&2; }
wait $lstm || { status=$?; echo "train_lstm.py failed ($status)" >&2; }
((status == 0)) && echo "both scripts finished"
exit $status
