package e2e

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestJobUserIsolation runs a warm job without run_as on agents with the
// default run_as: its workers and standbys run as a dynamic user of the
// job's own, the same uid on every node, and a local user (nobody) can
// neither read their environment (secret_env, the report token) nor reach
// the standby's socket.
func TestJobUserIsolation(t *testing.T) {
	const secret = "hf_job-user-target"
	c := newCluster(t)
	c.agentArgs = []string{"--stop-grace", faultStopGrace, "--run-as", ""}
	// The test's directories are private to root (t.TempDir): the job's
	// user reads the agent's standby script and enters its scratch and
	// socket directories under the state directories, and writes
	// checkpoints into a directory open to all, sticky, as a site would
	// give jobs without a user of their own.
	for _, dir := range []string{filepath.Dir(c.dir), c.dir} {
		require.NoError(t, os.Chmod(dir, 0o755))
	}
	ckpt := filepath.Join(c.dir, "ckpt")
	require.NoError(t, os.Mkdir(ckpt, 0o755))
	require.NoError(t, os.Chmod(ckpt, 0o777|os.ModeSticky))
	c.startEmbeddedController()
	c.startAgents()
	t.Cleanup(c.report)
	c.waitReady(t)

	job := faultJob(t, c, "job-user", func(spec map[string]any) {
		warmLauncher(spec)
		spec["nodes"] = map[string]any{"min": agentHosts, "max": agentHosts}
		spec["secret_env"] = map[string]any{"HF_TOKEN": secret}
	})
	require.Equal(t, ckpt, job.CkptDir)
	c.waitCheckpoint(t, job.Name, checkpointEvery)

	// The job's uid on each node, as the agents recorded it. On real nodes
	// the job's home uid (a hash of its name) is free on every node, so it
	// is the same everywhere. The harness's hosts share one process table:
	// an agent that allocates after another host's agent has started the
	// job's first process sees the home uid in use and takes the next one.
	// So some host has the home uid, and each has one of the next
	// agentHosts uids from it.
	const first, last = 61184, 65519
	h := fnv.New32a()
	_, _ = h.Write([]byte(job.Name))
	const size = last - first + 1
	home := first + h.Sum32()%size
	uids := make([]uint32, agentHosts)
	for i := range agentHosts {
		users := dynamicUsers(t, c, i)
		require.Contains(t, users, job.Name)
		uids[i] = users[job.Name]
		require.True(t, uids[i] >= first && uids[i] <= last, "uid %d on %s is from the default dynamic_users", uids[i], c.agentHost(i).Name)
		require.Less(t, (int64(uids[i])-int64(home)+size)%size, int64(agentHosts),
			"uid %d on %s is the job's home uid %d or one of the next, taken when another host's process held it", uids[i], c.agentHost(i).Name, home)
	}
	require.Contains(t, uids, home, "the first host to allocate gets the job's home uid")
	uid := uids[0]

	// On h1: a worker of generation 1, and the standby waiting for the
	// next generation (a standby with no generation, its socket directory
	// and name its third and fourth arguments).
	var worker, standby int
	var sock string
	deadline := time.Now().Add(recoveryBound)
	for worker == 0 || standby == 0 {
		require.True(t, time.Now().Before(deadline), "no worker and idle standby on %s", c.agentHost(0).Name)
		for _, pid := range netnsPids(t, c.agentHost(0)) {
			argv := procCmdline(pid)
			if len(argv) < 5 || !isZygote(argv[2]) {
				continue
			}
			parent := procCmdline(ppidOf(pid))
			switch gen := c.generationOf(pid); {
			case gen == "" && standby == 0:
				standby, sock = pid, filepath.Join(argv[3], argv[4])
			case gen == "1" && len(parent) > 2 && isZygote(parent[2]):
				worker = pid // forked by the generation's standby
			}
		}
		if worker == 0 || standby == 0 {
			time.Sleep(pollEvery)
		}
	}
	for _, pid := range []int{worker, standby} {
		require.Equal(t, strconv.FormatUint(uint64(uid), 10), strings.Fields(procStatus(pid, "Uid"))[0], "pid %d runs as the job's user", pid)
	}
	// It listens once its imports are done.
	for _, err := os.Stat(sock); err != nil; _, err = os.Stat(sock) {
		require.True(t, time.Now().Before(deadline), "the standby %d never listened on %s: %v", standby, sock, err)
		time.Sleep(pollEvery)
	}

	const attack = `
import socket, sys
for pid in sys.argv[1:3]:
    try:
        open("/proc/%s/environ" % pid, "rb").read()
        print("environ: read")
    except OSError as e:
        print("environ:", e.strerror)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[3])
    print("connect: connected")
except OSError as e:
    print("connect:", e.strerror)
`
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	out, _, err := c.agentHost(0).Run(ctx, []string{"PYTHONDONTWRITEBYTECODE=1"}, "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all", "--",
		"/usr/bin/python3", "-c", attack, strconv.Itoa(worker), strconv.Itoa(standby), sock)
	require.NoError(t, err)
	require.Equal(t, "environ: Permission denied\nenviron: Permission denied\nconnect: Permission denied\n", out)
	require.Equal(t, secret, procEnviron(worker)["HF_TOKEN"], "the worker has the secret the attacker could not read")

	// Stopped, the job runs no further generation: its standbys go, and
	// with them its uid.
	c.ctlOK(t, "stop", job.Name)
	deadline = time.Now().Add(recoveryBound)
	for i := range agentHosts {
		for len(dynamicUsers(t, c, i)) > 0 {
			require.True(t, time.Now().Before(deadline), "%s still holds %v", c.agentHost(i).Name, dynamicUsers(t, c, i))
			time.Sleep(pollEvery)
		}
	}
}

// dynamicUsers is agent i's record of its jobs' dynamic uids.
func dynamicUsers(t *testing.T, c *cluster, i int) map[string]uint32 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(c.stateDir(i), "dynamic_users.json"))
	require.NoError(t, err)
	var users map[string]struct {
		UID uint32 `json:"uid"`
	}
	require.NoError(t, json.Unmarshal(data, &users), "%s", data)
	out := map[string]uint32{}
	for job, u := range users {
		out[job] = u.UID
	}
	return out
}
