#!/usr/bin/env bash
# What rdzv is for, on this machine alone (docs/demo.md): a controller with
# embedded etcd and three agents standing in for three nodes run
# examples/train.py (DDP over gloo, torch 2.x from the venv `make venv`
# makes), and the demo breaks it twice:
#   1. one worker process is SIGKILLed: the job restarts on the same nodes
#      as generation 2, resuming from its newest complete checkpoint;
#   2. a whole node (its agent and workers) is SIGKILLed: the controller
#      declares it lost and the job goes on as generation 3 on the two left.
# It shows each recovery in the job's log, the incident timeline, the
# events, and the dashboard's address, and exits with the job's result.
# `make demo` builds bin/ and the venv first. Every wait is bounded.
#
# Environment: RDZV_VENV, the venv whose torchrun runs the workers (default
# .venv); RDZV_DEMO_KEEP=1 keeps .demo/ (logs, checkpoints) afterwards.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${RDZV_VENV:-.venv}
VENV=$(cd "$VENV" 2>/dev/null && pwd) || {
	echo "${RDZV_VENV:-.venv} is missing: run 'make demo' (it makes the venv), or set RDZV_VENV" >&2
	exit 1
}
[[ -x $VENV/bin/torchrun ]] || {
	echo "$VENV/bin/torchrun is missing: run 'make venv'" >&2
	exit 1
}
JOB=example-ddp
NODES=(demo-node-1 demo-node-2 demo-node-3)
STEPS=200
WAIT=90 # bound on each wait, in seconds

LC_DIR=.demo
LC_PY=$VENV/bin/python
LC_KEEP=${RDZV_DEMO_KEEP:-0}
# shellcheck source=localcluster.sh
source examples/localcluster.sh
lc_init

lc_log "creating a cluster CA and certificates in $LC_PKI (rdzvctl pki)"
lc_pki "${NODES[@]}"
lc_log "starting the controller on $LC_CONTROLLER (logs: $LC_DIR/controller.log)"
lc_start_controller
for i in "${!NODES[@]}"; do
	lc_log "starting agent ${NODES[i]} (logs: $LC_DIR/${NODES[i]}.log)"
	lc_start_agent "${NODES[i]}" $((i + 1))
done
lc_wait 60 "the agents to register" lc_nodes_registered "${NODES[@]}"
lc_ctl nodes

# examples/job.yaml with this venv's torchrun, a longer run, and a
# checkpoint directory of the demo's own.
cat >"$LC_DIR/job.yaml" <<EOF
name: $JOB
nodes: {min: 2, max: 3}
procs_per_node: 1
command: ["train.py", "--steps", "$STEPS", "--checkpoint-every", "20"]
workdir: $ROOT/examples
env: {OMP_NUM_THREADS: "1", PYTHONDONTWRITEBYTECODE: "1"}
checkpoint: {dir: $ROOT/$LC_DIR/checkpoints}
restart: {max_restarts: 3, backoff: {initial: 500ms, max: 5s}}
rendezvous: {last_call: 1s, timeout: 2m}
launcher: {torchrun: $VENV/bin/torchrun}
EOF
lc_log "the job ($LC_DIR/job.yaml):"
sed 's/^/    /' "$LC_DIR/job.yaml"
lc_log "the dashboard: http://127.0.0.1:$LC_HTTP_PORT/ (this job: http://127.0.0.1:$LC_HTTP_PORT/jobs/$JOB)"
lc_ctl start "$LC_DIR/job.yaml" >/dev/null
lc_log "started job $JOB (rdzvctl start $LC_DIR/job.yaml)"

# checkpoint_in GEN STEP: generation GEN (or a later one) has recorded a
# checkpoint of STEP or later.
checkpoint_in() {
	lc_job_is "$JOB" "int(j['generation']) >= $1 and int((j['latest_checkpoint'] or {}).get('step', 0)) >= $2 and int(j['latest_checkpoint']['generation']) >= $1"
}
# trains_after GEN: a generation after GEN runs and has reported a step. A
# loaded machine may add a restart of its own (a node's heartbeats late), so
# the demo follows whichever generation trains, not a fixed number.
trains_after() {
	lc_job_is "$JOB" "j['state'] == 'JOB_STATE_RUNNING' and int(j['generation']) > $1 and int(j.get('step') or 0) > 0"
}
generation() { lc_job 'int(j["generation"])' "$JOB"; }
latest_checkpoint() { lc_job 'int(j["latest_checkpoint"]["step"])' "$JOB"; }
show_log() { lc_ctl logs "$JOB" 2>/dev/null | grep -E "$1" | tail -n "$2" | sed 's/^/    /' || true; }

lc_wait "$WAIT" "generation 1's checkpoint of step 40" checkpoint_in 1 40
lc_ctl status "$JOB"

node=${NODES[1]}
pid=$(lc_kill_worker "$JOB" "$node")
ckpt=$(latest_checkpoint)
lc_log "FAULT 1: SIGKILLed the training process on $node (pid $pid); newest complete checkpoint: step $ckpt"
lc_wait "$WAIT" "generation 2 to train" trains_after 1
gen=$(generation)
lc_log "the first failure the controller hears of may be a peer's: rank 0's gloo connection to the killed worker broke"
lc_log "generation $gen resumed from step $ckpt on all three nodes (rdzvctl logs $JOB):"
show_log "RDZV_WORKER .*generation=$gen |RDZV_RESUMED .*step=$ckpt\$" 6

lc_wait "$WAIT" "generation $gen's checkpoint of step $((ckpt + 40))" checkpoint_in "$gen" $((ckpt + 40))
gen=$(generation)
node=${NODES[2]}
lc_kill_node "$node"
ckpt=$(latest_checkpoint)
lc_log "FAULT 2: SIGKILLed node $node (its agent and workers); newest complete checkpoint: step $ckpt"
lc_log "the controller declares $node lost once its heartbeats stop and its gossip peers cannot reach it either"
lc_wait "$WAIT" "generation $((gen + 1)) to train" trains_after "$gen"
gen=$(generation)
lc_log "generation $gen resumed from step $ckpt on the two nodes left:"
show_log "RDZV_WORKER .*generation=$gen |RDZV_RESUMED .*step=$ckpt\$" 4
lc_ctl nodes

finished() { lc_job_is "$JOB" 'j["state"] in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_STOPPED")'; }
lc_wait "$WAIT" "the job to finish" finished

lc_log "rank 0's training across the three generations, every 50 steps (rdzvctl logs $JOB):"
show_log "RDZV_WORKER rank=0|RDZV_RESUMED rank=0|RDZV_STEP rank=0 step=[0-9]*[05]0 |RDZV_DONE rank=0" 30
lc_log "the job and its incident timeline (rdzvctl status $JOB):"
lc_ctl status "$JOB"
lc_log "its events, without checkpoint_recorded (rdzvctl events $JOB):"
lc_ctl events "$JOB" | grep -v checkpoint_recorded
lc_log "the dashboard was at http://127.0.0.1:$LC_HTTP_PORT/jobs/$JOB (it stops with the demo)"

if lc_job_is "$JOB" 'j["state"] == "JOB_STATE_SUCCEEDED"'; then
	lc_log "job $JOB succeeded after 2 faults, in $SECONDS s"
else
	lc_log "job $JOB did not succeed: $(lc_job '"%s: %s" % (j["state"], j["reason"])' "$JOB")" >&2
	exit 1
fi
