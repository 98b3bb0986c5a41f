#!/usr/bin/env bash
# Runs examples/job.yaml on this machine alone: a controller with embedded etcd
# and two agents standing in for two nodes (the job needs at least two).
# `make demo` builds bin/ first. Exits with the job's result.
set -euo pipefail

cd "$(dirname "$0")/.."
DEMO=.demo
CONTROLLER=127.0.0.1:7070
# Everything speaks mutual TLS, with certificates made below.
PKI=$DEMO/pki
CTL=(bin/rdzvctl --controller "$CONTROLLER" --tls-dir "$PKI")

for b in rdzv-controller rdzv-agent rdzvctl; do
	if [[ ! -x bin/$b ]]; then
		echo "bin/$b is missing: run 'make demo' (or 'make build' first)" >&2
		exit 1
	fi
done

if [[ ! -x /usr/bin/torchrun ]]; then
	if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
		echo "== installing python3-torch (provides torchrun)"
		apt-get update
		DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch
	else
		echo "torchrun not found. Install PyTorch, e.g. on Debian or Ubuntu:" >&2
		echo "  sudo apt-get install python3-torch" >&2
		exit 1
	fi
fi

pids=() names=()
cleanup() {
	local rc=$?
	if ((${#pids[@]})); then
		# SIGTERM lets each agent stop its workers before it exits.
		kill -TERM "${pids[@]}" 2>/dev/null || true
		for _ in $(seq 150); do
			local alive=0 p
			for p in "${pids[@]}"; do
				if kill -0 "$p" 2>/dev/null; then alive=1; fi
			done
			((alive)) || break
			sleep 0.1
		done
		kill -KILL "${pids[@]}" 2>/dev/null || true
		wait || true
	fi
	if ((rc != 0)) && [[ -d $DEMO ]]; then
		for f in "$DEMO"/*.log; do
			echo "== last lines of $f"
			tail -n 20 "$f"
		done >&2
	fi
	rm -rf "$DEMO"
	exit "$rc"
}
trap cleanup EXIT
# Turn signals into a plain exit so that cleanup runs with a meaningful status.
trap 'exit 130' INT
trap 'exit 143' TERM

rm -rf "$DEMO"
mkdir -p "$DEMO"
if [[ -d examples/checkpoints ]]; then
	echo "== removing examples/checkpoints from an earlier run"
	rm -rf examples/checkpoints
fi

echo "== creating a cluster CA and certificates in $PKI (rdzvctl pki)"
bin/rdzvctl pki init --dir "$PKI" >/dev/null
bin/rdzvctl pki issue controller demo-controller --ip 127.0.0.1 --dir "$PKI" >/dev/null
bin/rdzvctl pki issue agent demo-node-1 --dir "$PKI" >/dev/null
bin/rdzvctl pki issue agent demo-node-2 --dir "$PKI" >/dev/null
# rdzvctl finds ca.crt, rdzvctl.crt and rdzvctl.key in --tls-dir.
bin/rdzvctl pki issue operator demo --dir "$PKI" --out "$PKI/rdzvctl" >/dev/null

echo "== starting controller on $CONTROLLER (logs: $DEMO/controller.log)"
# Its embedded etcd listens only on $DEMO/controller/etcd.sock (no TCP port).
bin/rdzv-controller --listen "$CONTROLLER" --data-dir "$DEMO/controller" \
	--tls-cert "$PKI/controller-demo-controller.crt" --tls-key "$PKI/controller-demo-controller.key" --tls-ca "$PKI/ca.crt" \
	>"$DEMO/controller.log" 2>&1 &
pids+=($!)
names+=(controller)

for n in 1 2; do
	echo "== starting agent demo-node-$n (logs: $DEMO/node-$n.log)"
	# Two agents share this machine, so each takes any free gossip port and
	# its own metrics port (9402, 9403; the controller's is 9401). When
	# the demo ends (or is interrupted) no agent comes back, so the workers
	# stop with their agent instead of waiting restart_grace for one.
	# Workers run as whoever runs the demo (root allowed for that): the job
	# writes its checkpoints under examples/. A real node keeps the default,
	# a dynamic user of each job's own, or a dedicated training user.
	bin/rdzv-agent --controller "$CONTROLLER" --node-name "demo-node-$n" --state-dir "$DEMO/node-$n" --gossip-port 0 --restart-grace 0 \
		--http-listen "127.0.0.1:$((9401 + n))" \
		--run-as "$(id -u):$(id -g)" --allow-root \
		--tls-cert "$PKI/agent-demo-node-$n.crt" --tls-key "$PKI/agent-demo-node-$n.key" --tls-ca "$PKI/ca.crt" \
		>"$DEMO/node-$n.log" 2>&1 &
	pids+=($!)
	names+=("demo-node-$n")
done

echo "== waiting for both agents to register"
for i in $(seq 60); do
	nodes=$("${CTL[@]}" nodes -o json 2>/dev/null || true)
	if grep -q '"demo-node-1"' <<<"$nodes" && grep -q '"demo-node-2"' <<<"$nodes"; then
		break
	fi
	for j in "${!pids[@]}"; do
		if ! kill -0 "${pids[j]}" 2>/dev/null; then
			echo "${names[j]} exited early" >&2
			exit 1
		fi
	done
	if ((i == 60)); then
		echo "agents did not register within 30s" >&2
		exit 1
	fi
	sleep 0.5
done

echo "== running examples/job.yaml"
set +e
"${CTL[@]}" start --wait examples/job.yaml
job_rc=$?
set -e

echo "== rdzvctl status example-ddp"
"${CTL[@]}" status example-ddp || true
echo "== rdzvctl logs example-ddp | tail -20"
"${CTL[@]}" logs example-ddp | tail -20 || true
echo "== rdzvctl events example-ddp"
"${CTL[@]}" events example-ddp || true

if ((job_rc == 0)); then
	echo "== job succeeded"
else
	echo "== job failed (rdzvctl exit status $job_rc)" >&2
fi
exit "$job_rc"
