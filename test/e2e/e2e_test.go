package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/test/netns"
)

// etcdBin is Debian's etcd-server.
const etcdBin = "/usr/bin/etcd"

func TestTrainingJobEmbeddedEtcd(t *testing.T) {
	c := newCluster(t)
	defer c.report()
	c.startEmbeddedController()
	c.startAgents()
	job, events := trainAndVerify(t, c)

	t.Run("invalid jobs change nothing", func(t *testing.T) {
		tests := []struct {
			name string
			edit func(spec map[string]any)
			want string
		}{
			{"bad-nodes", func(spec map[string]any) { spec["nodes"] = map[string]any{"min": 3, "max": 1} }, "nodes.max"},
			{"bad-field", func(spec map[string]any) { spec["bogus_field"] = true }, "bogus_field: unknown field"},
			// The spelling found in review: an abbreviation torchrun
			// accepts for --nnodes.
			{"abbreviated-nnodes", func(spec map[string]any) {
				launcher := spec["launcher"].(map[string]any)
				launcher["extra_args"] = append(launcher["extra_args"].([]any), "--nn=1")
			}, "spells torchrun's --nnodes, which rdzv sets"},
			{"pet-env", func(spec map[string]any) { spec["env"] = map[string]any{"PET_NNODES": "1"} }, "env.PET_NNODES: is read by torchrun as its --nnodes"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := c.ctl("start", job.variant(t, tt.name, tt.edit))
				require.Positive(t, r.exitCode(), "%s", r)
				require.Contains(t, r.stderr, tt.want, "%s", r)

				r = c.ctl("status", tt.name)
				require.Positive(t, r.exitCode(), "%s", r)
				require.Contains(t, r.stderr, "not found", "%s", r)
			})
		}
		// -o goes before the command: `rdzvctl list` ignores flags given
		// after it.
		var list struct {
			Jobs []jobJSON `json:"jobs"`
		}
		out := c.ctlOK(t, "-o", "json", "list")
		require.NoError(t, json.Unmarshal([]byte(out), &list), out)
		require.Len(t, list.Jobs, 1, out)
		require.Equal(t, job.Name, list.Jobs[0].Spec.Name)
		require.Equal(t, "JOB_STATE_SUCCEEDED", list.Jobs[0].State)
	})

	t.Run("a workdir missing on the nodes fails the job at once", func(t *testing.T) {
		name := "no-workdir"
		c.ctlOK(t, "start", job.variant(t, name, func(spec map[string]any) { spec["workdir"] = "/nonexistent/rdzv-e2e" }))
		j := c.waitJob(t, name, "failed", func(j jobJSON) bool { return j.State == "JOB_STATE_FAILED" })
		require.Regexp(t, `^workdir_missing: node \S+ \(rank \d\): workdir /nonexistent/rdzv-e2e is not a directory on node \S+; not restarted`, j.Reason)
		require.Zero(t, j.Restarts, "a restart would fail the same way")
		requireIdle(t, c)
	})

	t.Run("run_as with a privileged group is refused", func(t *testing.T) {
		// These agents run workers as root (--run-as root --allow-root);
		// a job's run_as still answers to their run_as_policy. 42 is
		// Debian's group shadow.
		name := "shadow-group"
		c.ctlOK(t, "start", job.variant(t, name, func(spec map[string]any) {
			spec["run_as"] = "65534:42"
			spec["restart"] = map[string]any{"max_restarts": 0}
		}))
		j := c.waitJob(t, name, "failed", func(j jobJSON) bool { return j.State == "JOB_STATE_FAILED" })
		refused := 0
		for _, a := range j.Assignments {
			if a.State == "WORKER_STATE_FAILED" {
				require.Contains(t, a.Message, `run_as "65534:42": has primary group 42 (shadow), which matches "shadow" in this agent's run_as_policy.privileged_groups; to allow it, remove "shadow" from that list`, "node %s", a.Node)
				refused++
			}
		}
		require.Positive(t, refused, "%+v", j)
		c.waitNodes(t, "idle after the refused job", func(nodes []nodeJSON) bool {
			for _, n := range nodes {
				if n.Job != "" {
					return false
				}
			}
			return true
		})
	})

	t.Run("unreachable controller", func(t *testing.T) {
		tests := []struct {
			name, addr string
			want       *regexp.Regexp
		}{
			{
				// Connection refused fails the call at once.
				"host up, nothing listening", c.agentHost(0).IP + ":" + controllerPort,
				regexp.MustCompile(`^rdzvctl: listing nodes: cannot reach the controller at 10\.77\.0\.11:7070 \(set --controller or RDZV_CONTROLLER\)`),
			},
			{
				// On the hosts' subnet but nobody has it: connecting waits
				// for ARP, which outlasts the 2s timeout, so the call ends on
				// its deadline. Either wording tells the operator where it
				// looked and that nothing answered.
				"no such host", "10.77.0.99:7070",
				regexp.MustCompile(`^rdzvctl: listing nodes: (cannot reach the controller at 10\.77\.0\.99:7070|the controller at 10\.77\.0\.99:7070 did not answer within 2s)`),
			},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				r := c.ctlWith(commandTimeout, "--controller", tt.addr, "--timeout", "2s", "nodes")
				require.Equal(t, 1, r.exitCode(), "%s", r)
				require.Empty(t, r.stdout, "%s", r)
				require.Regexp(t, tt.want, r.stderr, "%s", r)
			})
		}
	})

	t.Run("state survives a controller restart", func(t *testing.T) {
		registrations := func(i int) int {
			data, err := os.ReadFile(c.agents[i].LogPath())
			require.NoError(t, err)
			return strings.Count(string(data), `"registered with controller"`)
		}
		before := make([]int, agentHosts)
		for i := range before {
			before[i] = registrations(i)
		}
		begin := time.Now()
		c.restartController()
		// Nodes are loaded from etcd as READY, so READY alone would not show
		// that the agents came back: each must also have registered again.
		c.waitNodes(t, "READY and re-registered", func(nodes []nodeJSON) bool {
			for i, n := range nodes {
				if n.Info.Name != c.agentHost(i).Name || n.State != "NODE_STATE_READY" || registrations(i) <= before[i] {
					return false
				}
			}
			return true
		})
		t.Logf("e2e: controller restarted and all agents re-registered in %s", time.Since(begin).Round(time.Millisecond))
		requireSucceeded(t, c, job)
		var after struct {
			Events []eventJSON `json:"events"`
		}
		c.ctlJSON(t, &after, "events", job.Name)
		require.Equal(t, events, after.Events, "events changed across the restart")
		requireIdle(t, c)
	})
}

// The example job from warm standbys (launcher.kind warm): unchanged
// train.py, forked from a standby with torchrun's environment, trains to
// the end as under torchrun.
func TestTrainingJobWarm(t *testing.T) {
	c := newCluster(t)
	defer c.report()
	c.startEmbeddedController()
	c.startAgents()
	job, _ := trainAndVerify(t, c, warmLauncher)
	for i := range agentHosts {
		require.Regexp(t, `started [^\n]*: /usr/bin/python3 -u train\.py [^\n]*\(2 workers from a warm standby\)`, c.nodeLog(t, i, job.Name))
	}
}

// TestTrainingJobExternalEtcd runs the controller on Debian's etcd
// secured as docs/security.md#etcd asks: TLS with client certificates required,
// and RBAC letting the controller's certificate use /rdzv/v1/ only.
func TestTrainingJobExternalEtcd(t *testing.T) {
	if _, err := os.Stat(etcdBin); err != nil {
		netns.SkipOrFail(t, "e2e: %s is missing (apt-get install etcd-server)", etcdBin)
	}
	c := newCluster(t)
	defer c.report()
	h0 := c.controllerHost()
	endpoint := "https://" + h0.IP + ":2379"
	peer := "http://127.0.0.1:2380"
	// etcd's serving certificate, from the cluster CA; the controller's own
	// certificate is its client certificate, so its etcd user is its
	// common name.
	c.pki(t, "issue", "controller", "etcd", "--ip", h0.IP, "--dir", c.pkiDir)
	ca := filepath.Join(c.pkiDir, "ca.crt")
	controllerTLS := []string{ca, filepath.Join(c.pkiDir, "controller-rdzv-controller.crt"), filepath.Join(c.pkiDir, "controller-rdzv-controller.key")}
	h0.Start(t, "etcd", nil, etcdBin, "--name", "e2e", "--data-dir", filepath.Join(c.dir, "etcd-data"),
		"--listen-client-urls", endpoint, "--advertise-client-urls", endpoint,
		"--cert-file", filepath.Join(c.pkiDir, "controller-etcd.crt"), "--key-file", filepath.Join(c.pkiDir, "controller-etcd.key"),
		"--trusted-ca-file", ca, "--client-cert-auth",
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "e2e="+peer)
	// The controller would wait for etcd too, but a dead etcd is clearer
	// reported here.
	require.Eventually(t, func() bool {
		_, err := c.etcdGet(endpoint, "/", controllerTLS...)
		return err == nil
	}, readyTimeout, pollEvery, "etcd at %s never answered", endpoint)
	c.etcdHelper(t, "etcd-rbac", endpoint, ca, controllerTLS[1], controllerTLS[2], "controller/rdzv-controller")

	t.Run("only the controller's certificate gets in", func(t *testing.T) {
		// Refused in the TLS handshake, which the client retries until its
		// deadline.
		_, err := c.etcdGet(endpoint, "/rdzv/v1/", ca, "", "")
		require.Error(t, err, "no client certificate")
		_, err = c.etcdGet("http://"+h0.IP+":2379", "/rdzv/v1/")
		require.Error(t, err, "plaintext")
		// Let in by TLS, refused by RBAC.
		_, err = c.etcdGet(endpoint, "/rdzv/v1/", ca, filepath.Join(c.pkiDir, "rdzvctl.crt"), filepath.Join(c.pkiDir, "rdzvctl.key"))
		require.ErrorContains(t, err, "permission denied", "another certificate of the cluster CA")
		_, err = c.etcdGet(endpoint, "/", controllerTLS...)
		require.ErrorContains(t, err, "permission denied", "the controller's user may use /rdzv/v1/ only")
	})

	c.startController(append([]string{"--etcd-endpoints", endpoint, "--etcd-cacert", ca,
		"--etcd-cert", controllerTLS[1], "--etcd-key", controllerTLS[2]}, c.secretsKeyArgs()...)...)
	c.startAgents()
	// This run also covers launcher.kind python-module: the example job
	// through python3 -m torch.distributed.run rather than torchrun.
	job, _ := trainAndVerify(t, c, pythonModule)
	for i := range agentHosts {
		require.Regexp(t, `started [^\n]*: /usr/bin/python3 -m torch\.distributed\.run --nnodes 3 --node_rank \d --nproc_per_node 2 `, c.nodeLog(t, i, job.Name))
	}

	// The job's whole history must be in the external etcd: the controller
	// must not have fallen back to an etcd of its own.
	kvs, err := c.etcdGet(endpoint, "/rdzv/v1/", controllerTLS...)
	require.NoError(t, err)
	values := map[string][]byte{}
	for _, kv := range kvs {
		values[kv.Key] = kv.Value
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	t.Logf("e2e: %d rdzv keys in %s", len(keys), endpoint)
	for i := range agentHosts {
		require.Contains(t, keys, "/rdzv/v1/nodes/"+c.agentHost(i).Name)
		require.Contains(t, keys, "/rdzv/v1/workers/"+job.Name+"/"+c.agentHost(i).Name)
	}
	require.Contains(t, keys, "/rdzv/v1/rounds/"+job.Name+"/00000000000000000001")
	jobKey := "/rdzv/v1/jobs/" + job.Name
	require.Contains(t, keys, jobKey)
	var stored rdzvv1.Job
	require.NoError(t, proto.Unmarshal(values[jobKey], &stored))
	require.Equal(t, rdzvv1.JobState_JOB_STATE_SUCCEEDED, stored.GetState())
	require.EqualValues(t, 1, stored.GetGeneration())
	require.Equal(t, c.agentHost(0).IP, stored.GetMasterAddr())
}

// etcdGet reads every key under prefix from the etcd at endpoint, by running
// this test binary as an etcd client on h0; tlsFiles are its CA, client
// certificate and key, if any.
func (c *cluster) etcdGet(endpoint, prefix string, tlsFiles ...string) ([]etcdKV, error) {
	out, err := c.runHelper("etcd-get", append([]string{endpoint, prefix}, tlsFiles...)...)
	if err != nil {
		return nil, err
	}
	var kvs []etcdKV
	if err := json.Unmarshal([]byte(out), &kvs); err != nil {
		return nil, err
	}
	return kvs, nil
}

// etcdHelper runs a helper mode that must succeed.
func (c *cluster) etcdHelper(t *testing.T, mode string, args ...string) {
	t.Helper()
	_, err := c.runHelper(mode, args...)
	require.NoError(t, err)
}

// runHelper runs this test binary on h0 in a helper mode (see helperMain),
// returning its output.
func (c *cluster) runHelper(mode string, args ...string) (string, error) {
	return runHelperOn(c.controllerHost(), mode, args...)
}

// runHelperOn is runHelper on host h.
func runHelperOn(h *netns.Host, mode string, args ...string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	out, _, err := h.Run(ctx, []string{helperEnv + "=" + mode}, append([]string{self}, args...)...)
	return out, err
}
