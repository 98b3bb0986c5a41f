# shellcheck shell=bash
# A throwaway rdzv cluster on this machine, for examples/demo.sh and
# test/gpu/check.sh (sourced by both, run by neither): a controller with
# embedded etcd and agents standing in for nodes, all on loopback with mutual
# TLS and certificates made for the run, plus what both scripts do to it
# (find and kill a job's workers or a whole node, wait for a job's state,
# read its record). It needs bash, the binaries in $LC_BIN and a python3 (it
# parses rdzvctl's JSON with it); no network, no Go, no jq.
#
# Before sourcing, a script may set, or leave to its environment (defaults
# in brackets):
#   LC_DIR         run directory, removed at the end [.localcluster]
#   LC_BIN         rdzv-controller, rdzv-agent, rdzvctl [bin]
#   LC_PORT        controller gRPC port [7070]; the controller's metrics and
#                  dashboard listen on LC_HTTP_PORT [9401], agent i's on
#                  LC_HTTP_PORT+i
#   LC_PY          python3 used to read JSON [python3]
# Every wait is bounded; a failure prints why and the daemons' log tails,
# and lc_cleanup (installed as the EXIT trap by lc_init) stops everything
# that was started, whatever the exit path.

LC_DIR=${LC_DIR:-.localcluster}
LC_BIN=${LC_BIN:-bin}
LC_PORT=${LC_PORT:-7070}
LC_HTTP_PORT=${LC_HTTP_PORT:-9401}
LC_PY=${LC_PY:-python3}
LC_CONTROLLER=127.0.0.1:$LC_PORT
LC_PKI=$LC_DIR/pki
# Daemons started: pid and name, index for index.
LC_PIDS=()
LC_NAMES=()
# Set to 1 to keep $LC_DIR (its logs) after the run.
LC_KEEP=${LC_KEEP:-0}

lc_log() { printf '== %s\n' "$*"; }
lc_die() {
	printf 'FAILED: %s\n' "$*" >&2
	exit 1
}

# lc_ctl ARGS...: rdzvctl against this cluster.
lc_ctl() { "$LC_BIN/rdzvctl" --controller "$LC_CONTROLLER" --tls-dir "$LC_PKI" "$@"; }

# lc_init: checks the binaries, makes a fresh $LC_DIR and installs the traps.
lc_init() {
	local b
	for b in rdzv-controller rdzv-agent rdzvctl; do
		[[ -x $LC_BIN/$b ]] || lc_die "$LC_BIN/$b is missing (make build)"
	done
	command -v "$LC_PY" >/dev/null || lc_die "$LC_PY not found: it reads rdzvctl's JSON"
	trap lc_cleanup EXIT
	# Signals become a plain exit, so that lc_cleanup runs with a status.
	trap 'exit 130' INT
	trap 'exit 143' TERM
	rm -rf "$LC_DIR"
	mkdir -p "$LC_DIR"
}

# lc_cleanup [RC]: the EXIT trap (a script with its own calls it last, with
# the exit status). SIGTERM first lets each agent stop its workers; whatever
# is left after 15s is killed. On failure the daemons' log tails are
# printed. It exits with RC (default: the status it was called with).
lc_cleanup() {
	local rc=${1:-$?} p alive i f below=""
	set +e
	trap - EXIT INT TERM
	if ((${#LC_PIDS[@]})); then
		for p in "${LC_PIDS[@]}"; do
			for i in $(lc_descendants "$p"); do below+=" $i:$(lc_started_at "$i")"; done
		done
		kill -TERM "${LC_PIDS[@]}" 2>/dev/null || true
		for i in $(seq 150); do
			alive=0
			for p in "${LC_PIDS[@]}"; do
				if kill -0 "$p" 2>/dev/null; then alive=1; fi
			done
			((alive)) || break
			sleep 0.1
		done
		kill -KILL "${LC_PIDS[@]}" 2>/dev/null || true
		wait 2>/dev/null || true
	fi
	# Anything the daemons left behind (an agent that did not stop its
	# workers in time).
	for p in $below; do
		[[ $(lc_started_at "${p%:*}") == "${p#*:}" ]] && kill -KILL "${p%:*}" 2>/dev/null
	done
	if ((rc != 0)) && [[ -d $LC_DIR ]]; then
		for f in "$LC_DIR"/*.log; do
			[[ -e $f ]] || continue
			echo "== last lines of $f"
			tail -n 25 "$f"
		done >&2
	fi
	if ((LC_KEEP)); then
		echo "== kept $LC_DIR" >&2
	else
		rm -rf "$LC_DIR"
	fi
	exit "$rc"
}

# lc_started_at PID: when PID started (clock ticks since boot), which tells
# it from a later process that reuses the pid.
lc_started_at() { cut -d')' -f2- "/proc/$1/stat" 2>/dev/null | awk '{print $20}'; }

# lc_pki NODE...: a cluster CA, the controller's certificate, one per agent
# and rdzvctl's (ca.crt, rdzvctl.crt and rdzvctl.key in $LC_PKI).
lc_pki() {
	local n
	"$LC_BIN/rdzvctl" pki init --dir "$LC_PKI" >/dev/null
	"$LC_BIN/rdzvctl" pki issue controller lc-controller --ip 127.0.0.1 --dir "$LC_PKI" >/dev/null
	for n in "$@"; do
		"$LC_BIN/rdzvctl" pki issue agent "$n" --dir "$LC_PKI" >/dev/null
	done
	"$LC_BIN/rdzvctl" pki issue operator lc --dir "$LC_PKI" --out "$LC_PKI/rdzvctl" >/dev/null
}

lc_started() {
	LC_PIDS+=("$1")
	LC_NAMES+=("$2")
}

# lc_start_controller: the controller on $LC_CONTROLLER, its embedded etcd
# on a Unix socket in $LC_DIR/controller, its dashboard and metrics on
# 127.0.0.1:$LC_HTTP_PORT.
lc_start_controller() {
	"$LC_BIN/rdzv-controller" --listen "$LC_CONTROLLER" --data-dir "$LC_DIR/controller" \
		--http-listen "127.0.0.1:$LC_HTTP_PORT" \
		--tls-cert "$LC_PKI/controller-lc-controller.crt" --tls-key "$LC_PKI/controller-lc-controller.key" --tls-ca "$LC_PKI/ca.crt" \
		>"$LC_DIR/controller.log" 2>&1 &
	lc_started $! controller
}

# lc_start_agent NAME INDEX [FLAGS...]: an agent for node NAME, logging to
# $LC_DIR/NAME.log, its metrics on 127.0.0.1:$((LC_HTTP_PORT+INDEX)).
# Agents sharing a machine each take any free gossip and checkpoint peer
# port. No agent comes
# back once the run ends (or a node is killed), so workers stop with their
# agent instead of waiting restart_grace for one. Workers run as whoever
# runs this (root allowed for that).
lc_start_agent() {
	local name=$1 i=$2
	shift 2
	"$LC_BIN/rdzv-agent" --controller "$LC_CONTROLLER" --node-name "$name" \
		--state-dir "$LC_DIR/$name" --gossip-port 0 --peer-port 0 --restart-grace 0 \
		--http-listen "127.0.0.1:$((LC_HTTP_PORT + i))" \
		--run-as "$(id -u):$(id -g)" --allow-root \
		--tls-cert "$LC_PKI/agent-$name.crt" --tls-key "$LC_PKI/agent-$name.key" --tls-ca "$LC_PKI/ca.crt" \
		"$@" >"$LC_DIR/$name.log" 2>&1 &
	lc_started $! "$name"
}

# lc_alive: fails naming the first daemon that exited unexpectedly.
lc_alive() {
	local j
	for j in "${!LC_PIDS[@]}"; do
		[[ ${LC_NAMES[j]} == killed:* ]] && continue
		kill -0 "${LC_PIDS[j]}" 2>/dev/null || lc_die "${LC_NAMES[j]} exited early (see $LC_DIR/${LC_NAMES[j]}.log)"
	done
}

# lc_wait SECONDS WHAT CMD...: polls CMD every 0.5s until it succeeds, for
# at most SECONDS; fails with WHAT otherwise, or when a daemon dies.
lc_wait() {
	local secs=$1 what=$2 deadline
	shift 2
	deadline=$((SECONDS + secs))
	until "$@"; do
		lc_alive
		((SECONDS < deadline)) || lc_die "timed out after ${secs}s waiting for $what"
		sleep 0.5
	done
}

# lc_py_json EXPR: evaluates EXPR over the JSON on stdin, bound to j; prints
# the result (str as is, anything else as JSON). ts(S) is an RFC 3339 time
# (as rdzvctl prints them) in Unix seconds, on any python 3.
lc_py_json() {
	"$LC_PY" -c '
import datetime, json, re, sys
def ts(s):
    m = re.match(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-].*)$", s)
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
    t = t.replace(tzinfo=datetime.timezone.utc) if m.group(3) == "Z" else t
    return t.timestamp() + float(m.group(2) or 0)
j = json.load(sys.stdin)
r = eval(sys.argv[1])
print(r if isinstance(r, str) else json.dumps(r))' "$1"
}

# lc_nodes_registered NAME...: all these nodes are registered.
lc_nodes_registered() {
	local nodes n
	nodes=$(lc_ctl nodes -o json 2>/dev/null) || return 1
	for n in "$@"; do
		grep -q "\"$n\"" <<<"$nodes" || return 1
	done
}

# lc_job EXPR JOB: EXPR over the job's record (rdzvctl status JOB -o json,
# bound to j).
lc_job() { lc_ctl status "$2" -o json 2>/dev/null | lc_py_json "$1"; }

# lc_job_is JOB EXPR: EXPR over the job's record is true.
lc_job_is() { [[ $(lc_job "bool($2)" "$1" 2>/dev/null) == true ]]; }

# lc_resumed JOB GEN: the job runs generation GEN, which has reported a
# training step (its incident's first_step_at: the recovery is over).
lc_resumed() {
	lc_job_is "$1" "j['state'] == 'JOB_STATE_RUNNING' and int(j['generation']) == $2 and any(int(i['next_generation']) == $2 and i['first_step_at'] for i in j['incidents'] or [])"
}

# lc_children PID...: the processes whose parent is one of these.
lc_children() {
	local want=" $* "
	ps -e -o pid= -o ppid= | while read -r pid ppid; do
		[[ $want == *" $ppid "* ]] && echo "$pid"
	done
	return 0
}

# lc_descendants PID: every process below PID.
lc_descendants() {
	local level
	level=$(lc_children "$1")
	while [[ -n $level ]]; do
		echo "$level"
		level=$(lc_children $level)
	done
}

# lc_workers JOB NODE: pids of the job's training processes on NODE: the
# children of its launcher (torchrun, or the warm standby that forked them),
# which is the child of the agent's shim for the job's generation
# (rdzv-agent shim --dir STATE_DIR/workers/JOB.GENERATION). Under
# launcher.kind warm, node rank 0's standby also forks the job's TCPStore,
# which this cannot tell from a worker.
lc_workers() {
	local dir shims
	dir="$(cd "$LC_DIR" && pwd)/$2/workers/$1."
	shims=$(ps -e -o pid= -o args= | awk -v d="$dir" '$3 == "shim" && index($0, "--dir " d) { print $1 }')
	[[ -n $shims ]] || return 0
	# shellcheck disable=SC2046
	lc_children $(lc_children $shims)
}

# lc_kill_pids SIGNAL "PID..."
lc_kill_pids() {
	local p
	for p in $2; do kill "-$1" "$p" 2>/dev/null || true; done
}

# lc_kill_worker JOB NODE: SIGKILLs one training process of JOB on NODE and
# prints its pid; fails when there is none.
lc_kill_worker() {
	local pids
	pids=$(lc_workers "$1" "$2")
	[[ -n $pids ]] || lc_die "no worker of $1 on $2"
	set -- $pids
	kill -KILL "$1"
	echo "$1"
}

# lc_kill_node NAME: SIGKILLs node NAME's agent and every process below it
# (shims, launchers, workers, standbys) at once, stopped first so that none
# reacts before all are dead: as if the machine lost power.
lc_kill_node() {
	local name=$1 j pids
	for j in "${!LC_NAMES[@]}"; do
		[[ ${LC_NAMES[j]} == "$name" ]] || continue
		pids="${LC_PIDS[j]} $(lc_descendants "${LC_PIDS[j]}")"
		# No "Killed" notice from bash about the agent it started.
		disown "${LC_PIDS[j]}" 2>/dev/null || true
		lc_kill_pids STOP "$pids"
		lc_kill_pids KILL "$pids"
		LC_NAMES[j]="killed:$name"
		return 0
	done
	lc_die "no agent named $name"
}
