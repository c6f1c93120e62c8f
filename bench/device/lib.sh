# Shared set-up for device calls: wheels, nsys, and a step runner whose logs survive a kill.
# A step gets SIGTERM at its time limit and SIGKILL 15 s later (a capture busy in Triton's
# compiler once ignored SIGTERM for minutes and used up the call).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
source .gpu/nsys-env.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/o; mkdir -p $W/logs; R=$W/runs
pack() { cp bench/results/* $W/ 2>/dev/null; tar czf $OUT/$TAG.tgz -C $W . 2>/dev/null; }
step() { local t=$1 name=$2; shift 2; echo "=== [$(date +%T)] $name"; timeout -k 15 $t "$@" > $W/logs/$name.log 2>&1; echo "rc=$? ($name)"; tail -${TAILN:-6} $W/logs/$name.log; pack; }
