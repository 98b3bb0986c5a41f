#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): on a machine with NVIDIA GPUs and a
# python whose torch has CUDA and NCCL, from prebuilt binaries in bin/
# (make gpu-bundle), with no Go, no make and no network needed:
#   1. the agent's NVML inventory and health of the GPUs, through rdzvctl;
#   2. a one-node job over NCCL (launcher python-module: torchrun) through a
#      real controller and agent, a worker SIGKILLed mid-run, and the job
#      resumed in generation 2 from the newest complete checkpoint;
#   3. the same under launcher.kind warm: generation 2 forked from a warm
#      standby, its workers on CUDA;
#   4. the default launcher (none named) with in-memory checkpoints of CUDA
#      state every step: generation 2 resumes from the in-memory step the
#      controller chose, newer than the durable one, its optimizer on CUDA.
# Each step prints PASS, FAIL or SKIPPED, then the figures; the exit status
# is non-zero when any step failed. Everything started is stopped on exit.
#
# Environment:
#   GPU_CHECK_CPU=1      no GPU: gloo instead of NCCL, the NVML step SKIPPED
#                        (to try the flow on any machine)
#   GPU_CHECK_PYTHON     the python to run workers with (default: the first of
#                        python3, python, /usr/bin/python3, /usr/local/bin/python3,
#                        /opt/conda/bin/python that imports torch, with CUDA
#                        unless GPU_CHECK_CPU=1)
#   GPU_CHECK_BIN        the binaries (default bin/)
#   GPU_CHECK_PORT       the controller's port (default 17070; its dashboard
#                        is on GPU_CHECK_PORT+2331, the agent's metrics one above)
#   GPU_CHECK_TIMEOUT    bound on the whole check in seconds (default 450)
#   GPU_CHECK_KEEP=1     keep .gpu-check/ (logs, job files) afterwards
set -euo pipefail

SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$SELF")/../.."
# The whole check is bounded: past GPU_CHECK_TIMEOUT it gets SIGTERM (its
# cleanup runs), and SIGKILL 30s later.
if [[ -z ${GPU_CHECK_BOUNDED:-} ]]; then
	GPU_CHECK_BOUNDED=1 exec timeout -k 30 "${GPU_CHECK_TIMEOUT:-450}" bash "$SELF" "$@"
fi
ROOT=$PWD
CPU=${GPU_CHECK_CPU:-0}
NODE=gpu-check-node
# Steps of the job, a checkpoint every CKPT_EVERY; the worker is killed once
# the checkpoint of KILL_AFTER is recorded.
STEPS=300
CKPT_EVERY=10
# The memory variant's durable interval, and how many steps past its
# newest durable checkpoint it is killed (2 s of steps: the node's
# holdings have been reported since).
MEM_CKPT_EVERY=100
MEM_PAST=40
KILL_AFTER=30
WAIT=180 # bound on each wait for a job

results=() figures=()
pass() {
	echo "PASS: $*"
	results+=("PASS     $*")
}
skip() {
	echo "SKIPPED: $*"
	results+=("SKIPPED  $*")
}
fail() {
	echo "FAIL: $*" >&2
	results+=("FAIL     $*")
	FAILED=1
}
figure() {
	echo "FIGURE: $*"
	figures+=("$*")
}
FAILED=0

summary() {
	local r
	echo
	echo "== gpu-check summary ($(date -u +%FT%TZ), $((SECONDS))s)"
	for r in "${results[@]}"; do echo "  $r"; done
	for r in "${figures[@]}"; do echo "  figure: $r"; done
}

# The python that runs the workers: one that imports torch (with CUDA and
# NCCL, unless in CPU mode).
probe='import torch, torch.distributed as d, sys
cpu = sys.argv[1] == "1"
ok = cpu or (torch.cuda.is_available() and d.is_nccl_available())
sys.exit(0 if ok else 1)'
PY=${GPU_CHECK_PYTHON:-}
if [[ -z $PY ]]; then
	for c in python3 python /usr/bin/python3 /usr/local/bin/python3 /opt/conda/bin/python; do
		c=$(command -v "$c" 2>/dev/null) || continue
		if "$c" -c "$probe" "$CPU" 2>/dev/null; then
			PY=$c
			break
		fi
	done
fi
if [[ -z $PY ]] || ! "$PY" -c "$probe" "$CPU"; then
	echo "FAIL: no python with torch$( ((CPU)) || echo ' (CUDA and NCCL)') found; set GPU_CHECK_PYTHON" >&2
	exit 1
fi

LC_DIR=.gpu-check
LC_BIN=${GPU_CHECK_BIN:-bin}
LC_PORT=${GPU_CHECK_PORT:-17070}
LC_HTTP_PORT=$((LC_PORT + 2331))
LC_PY=$PY
LC_KEEP=${GPU_CHECK_KEEP:-0}
# shellcheck source=../../examples/localcluster.sh
source examples/localcluster.sh
lc_init
# The summary, then localcluster's cleanup, on every exit.
on_exit() {
	local rc=$?
	set +e
	summary
	((rc == 0 && FAILED == 0)) || rc=1
	lc_cleanup "$rc"
}
trap on_exit EXIT
echo "== gpu-check: $( ((CPU)) && echo 'CPU mode (GPU_CHECK_CPU=1)' || echo 'GPU mode')"
echo "== binaries: $("$LC_BIN/rdzv-agent" --version 2>&1 | head -1)"
"$PY" -c 'import sys, torch, torch.distributed as d
try:
    v = torch.cuda.nccl.version() if torch.cuda.is_available() else "-"
    nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:
    nccl = "unknown (%s)" % e
print("== python", sys.executable, sys.version.split()[0], "torch", torch.__version__,
      "cuda", torch.version.cuda, "devices", torch.cuda.device_count(), "nccl", nccl)'

# Health checks that judge the machine rather than rdzv are relaxed, so that
# a test box (persistence mode off, InfiniBand ports down) still takes the
# job; the verdicts are printed below whatever they are.
cat >"$LC_DIR/agent.yaml" <<'EOF'
health_checks:
  gpu: {persistence_mode: false}
  network: {infiniband: false}
EOF

lc_pki "$NODE"
lc_start_controller
lc_start_agent "$NODE" 1 --config "$LC_DIR/agent.yaml"
lc_wait 60 "the agent to register" lc_nodes_registered "$NODE"
pass "controller and agent up (mutual TLS on loopback, embedded etcd)"

# 1. NVML inventory and health.
nodes=$(lc_ctl nodes -o json)
# The node's record; the expressions below read it as j.
node=$(lc_py_json '[n for n in j["nodes"] if n["info"]["name"] == "'$NODE'"][0]' <<<"$nodes")
on_node() { lc_py_json "$1" <<<"$node"; }
ngpus=$(on_node 'len(j["info"]["gpus"] or [])')
echo "== health verdicts of $NODE:"
on_node '"\n".join("  %s ok=%s critical=%s: %s" % (c["name"], c["ok"], c["critical"], c["message"]) for c in j["health_checks"] or [])'
if ((CPU)); then
	skip "NVML inventory and health (CPU mode; the agent found $ngpus GPUs)"
	GPUS_PER_NODE=0
	PROCS=2
else
	smi=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
	names=$(on_node '", ".join(sorted(set(g["name"] for g in j["info"]["gpus"] or [])))')
	echo "== NVML inventory: $(on_node 'j["info"]["gpus"]')"
	if ((ngpus < 1)); then
		fail "NVML inventory: the agent found no GPU"
	elif [[ $(on_node 'j["info"]["fake_gpus"]') != false ]]; then
		fail "NVML inventory: the GPUs are fake"
	elif [[ $(on_node 'all(g["name"] and g["uuid"] and int(g["memory_bytes"]) > 0 for g in j["info"]["gpus"])') != true ]]; then
		fail "NVML inventory: a GPU without name, UUID or memory"
	elif [[ $smi != 0 && $smi != "$ngpus" ]]; then
		fail "NVML inventory: $ngpus GPUs, nvidia-smi -L lists $smi"
	else
		pass "NVML inventory: $ngpus GPUs ($names)"
	fi
	figure "GPUs: $ngpus x $names"
	gpu_ok=$(on_node '[c["ok"] for c in j["health_checks"] or [] if c["name"] == "gpu"]')
	if [[ $gpu_ok == "[true]" ]]; then
		pass "NVML health: the agent's gpu check passes"
	else
		fail "NVML health: the agent's gpu check is $gpu_ok (expected one passing verdict)"
	fi
	((ngpus >= 1)) || exit 1 # no job can run
	GPUS_PER_NODE=$ngpus
	PROCS=$ngpus
fi

# job_file NAME LAUNCHER_YAML: a one-node job of train_gpu.py on all the
# node's GPUs (or 2 CPU processes), checkpointing to its own directory; a
# variant named *memory* also saves in-memory checkpoints every step. An
# empty LAUNCHER_YAML names no launcher (the default).
job_file() {
	local name=$1 launcher=$2 req=', "--allreduce-bytes", "4194304"' mem="" every=$CKPT_EVERY
	((CPU)) || req=', "--require-cuda"'
	if [[ $name == *memory* ]]; then
		# Durable checkpoints far apart: the controller resumes from the
		# newest step it knows of, and a node's in-memory holdings reach it
		# with its progress reports (once a heartbeat), durable ones at once.
		req+=', "--memory-every", "1"'
		mem=$'\n  memory: {replicas: 1}'
		every=$MEM_CKPT_EVERY
	fi
	cat >"$LC_DIR/$name.yaml" <<EOF
name: $name
nodes: 1
gpus_per_node: $GPUS_PER_NODE
procs_per_node: $PROCS
command: ["train_gpu.py", "--steps", "$STEPS", "--checkpoint-every", "$every"$req]
workdir: $ROOT/test/gpu
env:
  OMP_NUM_THREADS: "1"
  PATH: "$(dirname "$PY"):/usr/local/bin:/usr/bin:/bin"
  PYTHONPATH: "$ROOT/python/src"
  PYTHONDONTWRITEBYTECODE: "1"
  GPU_CHECK_PIDS: "$ROOT/$LC_DIR/pids-$name"
checkpoint:
  dir: $ROOT/$LC_DIR/ckpt-$name$mem
restart: {max_restarts: 2, backoff: {initial: 500ms, max: 2s}}
rendezvous: {last_call: 0s, timeout: 2m}
${launcher:+launcher: $launcher}
EOF
}

# gen_pids JOB GEN: the pids of generation GEN's workers that are running
# (train_gpu.py writes them to GPU_CHECK_PIDS). Not localcluster's
# lc_workers: a warm standby on node rank 0 also forks the TCPStore.
gen_pids() {
	local f p
	for f in "$LC_DIR/pids-$1/$2".*; do
		[[ -e $f ]] || continue
		p=$(<"$f")
		[[ $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) == *python* ]] && echo "$p"
	done
	return 0
}

# standby_ready JOB: the standby for JOB's next generation has imported its
# preload (its socket exists: the zygote binds it after the imports; the
# agent removes the socket of the one it handed the running generation).
# Warm standbys are zygote processes whose arguments are the socket's
# directory (.../warm/JOB) and name.
standby_ready() {
	local p args i ready=()
	for p in /proc/[0-9]*; do
		mapfile -d '' -t args <"$p/cmdline" 2>/dev/null || continue
		for ((i = 0; i + 2 < ${#args[@]}; i++)); do
			if [[ ${args[i]} == *rdzv_zygote.py && ${args[i + 1]} == */warm/$1 && -S ${args[i + 1]}/${args[i + 2]} ]]; then
				ready+=("${args[i + 2]}")
			fi
		done
	done
	((${#ready[@]} > 0))
}

job_finished() { lc_job_is "$1" 'j["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_STOPPED")'; }

# run_variant NAME LAUNCHER_YAML: starts the job, kills a worker once the
# checkpoint of KILL_AFTER is recorded, and checks generation 2 resumed
# from the newest complete checkpoint and trained to the end.
run_variant() {
	local name=$1 launcher=$2 ok=1 pid latest logs resumed workers workers2 parent parents2 figs
	job_file "$name" "$launcher"
	mkdir -p "$LC_DIR/pids-$name"
	lc_ctl start "$LC_DIR/$name.yaml" >/dev/null
	if ! (lc_wait "$WAIT" "$name's checkpoint of step $KILL_AFTER" \
		lc_job_is "$name" 'int((j["latest_checkpoint"] or {}).get("step", 0)) >= '$KILL_AFTER' or j["state"] != "JOB_STATE_RUNNING" and j["state"] != "JOB_STATE_PENDING"'); then
		fail "$name: no checkpoint of step $KILL_AFTER: $(lc_job '"%s: %s" % (j["state"], j["reason"])' "$name")"
		return
	fi
	if ! lc_job_is "$name" 'j["state"] == "JOB_STATE_RUNNING" and int(j["generation"]) == 1'; then
		fail "$name: not running generation 1 at its checkpoint: $(lc_job '(j["state"], j["generation"], j.get("reason", ""))' "$name")"
		return
	fi
	workers=$(gen_pids "$name" 1)
	if (($(wc -w <<<"$workers") != PROCS)); then
		fail "$name: generation 1 has workers '$workers' running, expected $PROCS"
		return
	fi
	if [[ $name == *warm* || $name == *default* ]] &&
		! (lc_wait "$WAIT" "$name's standby for generation 2" standby_ready "$name"); then
		# A fault long into a run finds the next standby ready; one right
		# after the start would measure the standby's imports instead.
		fail "$name: no warm standby ready for generation 2"
		return
	fi
	if [[ $name == *memory* ]] &&
		! (lc_wait "$WAIT" "$name $MEM_PAST steps past its durable checkpoint" \
			lc_job_is "$name" 'int(j.get("step", 0)) >= int(j["latest_checkpoint"]["step"]) + '$MEM_PAST' or j["state"] != "JOB_STATE_RUNNING"'); then
		fail "$name: not $MEM_PAST steps past its durable checkpoint"
		return
	fi
	pid=$(tail -n 1 <<<"$workers")
	kill -KILL "$pid"
	latest=$(lc_job 'int(j["latest_checkpoint"]["step"])' "$name")
	echo "== $name: SIGKILLed worker pid $pid (newest complete checkpoint: step $latest)"
	# Generation 2's workers, once running, before they finish.
	if ! (lc_wait "$WAIT" "$name's generation 2" lc_resumed "$name" 2); then
		fail "$name: no generation 2 training past step $latest"
		return
	fi
	workers2=$(gen_pids "$name" 2)
	parents2=""
	for pid in $workers2; do
		parent=$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null) &&
			parent=$(tr '\0' ' ' <"/proc/$parent/cmdline" 2>/dev/null | tr ' ' '_') || parent=gone
		parents2+=" ${parent:-gone}"
	done
	if ! (lc_wait "$WAIT" "$name to finish" job_finished "$name"); then
		fail "$name: did not finish"
		return
	fi
	logs=$(lc_ctl logs "$name" 2>&1 || true)
	printf '%s\n' "$logs" >"$LC_DIR/$name.job.log"
	local state gen
	state=$(lc_job 'j["state"]' "$name")
	gen=$(lc_job 'int(j["generation"])' "$name")
	[[ $state == JOB_STATE_SUCCEEDED ]] || { fail "$name: $state: $(lc_job 'j.get("reason", "")' "$name")"; ok=0; }
	[[ $gen == 2 ]] || { fail "$name: ended in generation $gen, expected 2 (one restart, after the kill)"; ok=0; }
	# The newest checkpoint generation 1 completed (one may have completed
	# between the kill and the reading of $latest).
	latest=$(lc_ctl events "$name" -o json | lc_py_json 'max(int(re.search(r"step (\d+)", e["message"]).group(1)) for e in j["events"] if e["kind"] == "checkpoint_recorded" and int(e["generation"]) == 1)')
	resumed=$(grep -o 'GPU_CHECK_RESUMED rank=0 generation=2 step=[0-9]* source=[a-z]*' <<<"$logs" | sed 's/.*step=//' | head -1 || true)
	if [[ $name == *memory* ]]; then
		# The in-memory step the controller chose (its resume_memory event),
		# no older than the newest durable one, restored on every rank.
		local mem
		mem=$(lc_ctl events "$name" -o json | lc_py_json '",".join(re.search(r"in-memory step (\d+)", e["message"]).group(1) for e in j["events"] if e["kind"] == "resume_memory" and int(e["generation"]) == 2)')
		if [[ -z $mem || $resumed != "$mem source=memory" ]] || ((mem < latest)); then
			fail "$name: generation 2 resumed from '${resumed}', expected the in-memory step of its resume_memory event ('$mem'), not older than the durable step $latest"
			ok=0
		elif (($(grep -c "GPU_CHECK_RESUMED .*generation=2 step=$mem source=memory" <<<"$logs") != PROCS)); then
			fail "$name: not every rank of generation 2 resumed from in-memory step $mem"
			ok=0
		elif ((!CPU)) && (($(grep -c "GPU_CHECK_RESUMED .*generation=2 .*source=memory optimizer_on=cuda$" <<<"$logs") != PROCS)); then
			fail "$name: the restored optimizer state is not on CUDA on every rank: $(grep 'GPU_CHECK_RESUMED .*generation=2' <<<"$logs" | tr '\n' ';')"
			ok=0
		fi
		latest="$mem (in memory; newest durable $latest)"
	elif [[ $resumed != "$latest source=durable" ]]; then
		fail "$name: generation 2 resumed from step '${resumed}', expected the newest complete checkpoint $latest"
		ok=0
	fi
	if ! grep -q "GPU_CHECK_DONE rank=0 generation=2 steps=$STEPS" <<<"$logs"; then
		fail "$name: generation 2 did not train to step $STEPS"
		ok=0
	fi
	local w2 cuda2
	w2=$(grep -c 'GPU_CHECK_WORKER .*generation=2 ' <<<"$logs" || true)
	cuda2=$(grep 'GPU_CHECK_WORKER .*generation=2 ' <<<"$logs" | grep -c ' cuda=1 visible=[^ ]' || true)
	if ((w2 != PROCS)); then
		fail "$name: $w2 workers in generation 2, expected $PROCS"
		ok=0
	elif ((!CPU && cuda2 != PROCS)); then
		fail "$name: $((PROCS - cuda2)) of generation 2's workers without CUDA or CUDA_VISIBLE_DEVICES"
		ok=0
	fi
	if [[ $name == *warm* || $name == *default* ]]; then
		# Generation 2 forked from the standby: every worker's parent is
		# the agent's zygote, not a launcher.
		[[ -n $workers2 ]] || { fail "$name: no worker of generation 2 seen running"; ok=0; }
		for parent in $parents2; do
			if [[ $parent != *rdzv_zygote.py* ]]; then
				fail "$name: a worker of generation 2 was not forked by a warm standby (parent: $parent)"
				ok=0
			fi
		done
	fi
	((ok)) && pass "$name: worker killed at step >= $KILL_AFTER, generation 2 resumed from step $latest and finished$( ((CPU)) || echo ', every worker on CUDA')"
	grep 'GPU_CHECK_WORKER .*generation=2 ' <<<"$logs" | head -n "$PROCS" | sed 's/^/   /'
	grep -o 'GPU_CHECK_ALLREDUCE generation=1 .*' <<<"$logs" | head -1 | sed 's/^/   /' || true
	figs=$(lc_job '"fault to first resumed step %.2fs (detected +%.2fs, fenced +%.2fs, committed +%.2fs, started +%.2fs)" % tuple(ts(j["incidents"][-1][k]) - ts(j["incidents"][-1]["fault_at"]) for k in ("first_step_at", "detected_at", "fenced_at", "committed_at", "started_at"))' "$name" || echo "no incident timeline")
	figure "$name: $figs"
	local bw
	bw=$(grep -o 'GPU_CHECK_ALLREDUCE generation=1 .*busbw_gbps=[0-9.]*' <<<"$logs" | head -1 | sed 's/.*bytes=\([0-9]*\).*busbw_gbps=/\1 /' || true)
	[[ -n $bw ]] && figure "$name: all-reduce of ${bw% *} bytes over $PROCS ranks: ${bw#* } GB/s bus bandwidth"
	return 0
}

run_variant gpu-check-torchrun "{kind: python-module, python: \"$PY\"}"
run_variant gpu-check-warm "{kind: warm, python: \"$PY\"}"
# No launcher named: auto, warm for a script.
run_variant gpu-check-memory-default ""

((FAILED == 0))
