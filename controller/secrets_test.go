package controller_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/controller/keyring"
	"github.com/rdzv/rdzv/controller/store"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// A secret_env value reaches the workers, and is kept in etcd, but shows
// in no API response, event or log line of the controller or the agents.
func TestSecretsNeverShow(t *testing.T) {
	const secret = "hf_s3cret-value-123"
	c := newCluster(t)
	c.addAgent("node-a", 0, nil)

	spec := c.spec("secret", 1, 1, "ok")
	spec.SecretEnv = map[string]string{"JOB_SECRET": secret}
	var shown []proto.Message
	resp, err := c.jobs.StartJob(rpcCtx(t), &rdzvv1.StartJobRequest{Spec: spec})
	require.NoError(t, err)
	shown = append(shown, resp)
	require.Equal(t, jobspec.Redacted, resp.GetJob().GetSpec().GetSecretEnv()["JOB_SECRET"])
	c.waitJobState("secret", succeeded)

	require.Equal(t, secret, c.record("secret", "node-a", 1).Env["JOB_SECRET"], "the worker gets the value")

	get, err := c.jobs.GetJob(rpcCtx(t), &rdzvv1.GetJobRequest{Name: "secret"})
	require.NoError(t, err)
	list, err := c.jobs.ListJobs(rpcCtx(t), &rdzvv1.ListJobsRequest{})
	require.NoError(t, err)
	stop, err := c.jobs.StopJob(rpcCtx(t), &rdzvv1.StopJobRequest{Name: "secret"})
	require.NoError(t, err)
	events, err := c.jobs.ListEvents(rpcCtx(t), &rdzvv1.ListEventsRequest{Job: "secret"})
	require.NoError(t, err)
	shown = append(shown, get, list, stop, events)
	require.Equal(t, jobspec.Redacted, get.GetJob().GetSpec().GetSecretEnv()["JOB_SECRET"])
	require.NotEmpty(t, events.GetEvents())
	for _, m := range shown {
		b, err := protojson.Marshal(m)
		require.NoError(t, err)
		require.NotContains(t, string(b), secret, "%T shows the secret", m)
	}

	require.NotZero(t, c.logs.Len())
	for _, e := range c.logs.All() {
		require.NotContains(t, fmt.Sprint(e.Message, e.ContextMap()), secret, "a log line shows the secret")
	}

	// Kept, but sealed: etcd's data does not give it away.
	kv, err := c.etcdClient().Get(rpcCtx(t), store.JobKey("secret"))
	require.NoError(t, err)
	require.Len(t, kv.Kvs, 1)
	require.NotContains(t, string(kv.Kvs[0].Value), secret, "the secret is stored in plaintext")
	var stored rdzvv1.Job
	require.NoError(t, proto.Unmarshal(kv.Kvs[0].Value, &stored))
	require.True(t, strings.HasPrefix(stored.GetSpec().GetSecretEnv()["JOB_SECRET"], "rdzv-sealed:v1:"), "the stored job lost its secret")
}

// A sealed secret is opened again by a restarted controller and reaches
// the workers.
func TestSecretsSurviveRestart(t *testing.T) {
	const secret = "hf_after-restart"
	c := newCluster(t)
	spec := c.spec("secret", 1, 1, "ok")
	spec.SecretEnv = map[string]string{"JOB_SECRET": secret}
	c.startJob(spec)
	c.stopController()
	c.startController()

	c.addAgent("node-a", 0, nil)
	c.waitJobState("secret", succeeded)
	require.Equal(t, secret, c.record("secret", "node-a", 1).Env["JOB_SECRET"])
}

// With a key file that does not hold the key a secret was sealed with, the
// job is failed with the reason and never run; other jobs run.
func TestSecretsWithWrongKey(t *testing.T) {
	c := newCluster(t)
	spec := c.spec("secret", 1, 1, "ok")
	spec.SecretEnv = map[string]string{"JOB_SECRET": "hf_x"}
	c.startJob(spec)
	c.stopController()
	keys := c.cfg.SecretsKeyPath()
	require.NoError(t, os.Remove(keys))
	require.NoError(t, keyring.Create(keys, time.Now().Add(time.Hour)))
	c.startController()

	job := c.getJob("secret")
	require.Equal(t, failed, job.GetState())
	require.Contains(t, job.GetReason(), "secret_env JOB_SECRET")
	require.Contains(t, job.GetReason(), "is not in "+keys)
	c.addAgent("node-a", 0, nil)
	c.startJob(c.spec("other", 1, 1, "ok"))
	c.waitJobState("other", succeeded)
	require.False(t, c.hasRecord("secret", "node-a", 1), "the job whose secret could not be opened ran")
	require.Equal(t, failed, c.getJob("secret").GetState())
}

// The key file is created only where that is safe, and refused when other
// users could read it; the controller then does not start.
func TestSecretsKeyFileChecks(t *testing.T) {
	run := func(t *testing.T, edit func(*controller.Config)) error {
		cfg := controller.DefaultConfig()
		cfg.Insecure, cfg.Listen, cfg.DataDir = true, "127.0.0.1:0", t.TempDir()
		cfg.HTTP.Listen = ""
		edit(&cfg)
		ctl, err := controller.New(cfg, testLogger(t))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		return ctl.Run(ctx)
	}
	t.Run("readable by others", func(t *testing.T) {
		keys := filepath.Join(t.TempDir(), "secrets.key")
		require.NoError(t, keyring.Create(keys, time.Now()))
		require.NoError(t, os.Chmod(keys, 0o644))
		err := run(t, func(c *controller.Config) { c.SecretsKeyFile = keys })
		require.ErrorContains(t, err, "secrets_key_file: secrets key file "+keys+": mode 0644")
	})
	t.Run("named explicitly but missing", func(t *testing.T) {
		keys := filepath.Join(t.TempDir(), "secrets.key")
		err := run(t, func(c *controller.Config) { c.SecretsKeyFile = keys })
		require.ErrorIs(t, err, os.ErrNotExist)
		require.ErrorContains(t, err, "secrets_key_file: "+keys+" does not exist")
		require.NoFileExists(t, keys)
	})
	t.Run("external etcd without one", func(t *testing.T) {
		var dataDir string
		err := run(t, func(c *controller.Config) {
			c.Etcd.Endpoints, dataDir = []string{"http://127.0.0.1:1"}, c.DataDir
		})
		require.ErrorContains(t, err, "every controller replica the same file")
		require.NoFileExists(t, filepath.Join(dataDir, "secrets.key"))
	})
}

// With embedded etcd the default key file is created, private, and kept.
func TestSecretsKeyFileCreated(t *testing.T) {
	c := newCluster(t)
	info, err := os.Stat(c.cfg.SecretsKeyPath())
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	before, err := os.ReadFile(c.cfg.SecretsKeyPath())
	require.NoError(t, err)
	c.stopController()
	c.startController()
	after, err := os.ReadFile(c.cfg.SecretsKeyPath())
	require.NoError(t, err)
	require.Equal(t, before, after, "a restart replaced the key")
}

// A job stored with its secrets in plaintext (by a version before sealing)
// is sealed when a controller takes the lead, and runs with them.
func TestPlaintextSecretsSealedOnLoad(t *testing.T) {
	const secret = "hf_from-an-older-version"
	c := newCluster(t)
	spec := c.spec("legacy", 1, 1, "ok")
	spec.SecretEnv = map[string]string{"JOB_SECRET": secret}
	b, err := proto.Marshal(&rdzvv1.Job{Spec: spec, State: rdzvv1.JobState_JOB_STATE_PENDING})
	require.NoError(t, err)
	_, err = c.etcdClient().Put(rpcCtx(t), store.JobKey("legacy"), string(b))
	require.NoError(t, err)

	c.stopController()
	c.startController()
	// The new leader reseals through its writer, after it took the lead.
	c.settle()
	kv, err := c.etcdClient().Get(rpcCtx(t), store.JobKey("legacy"))
	require.NoError(t, err)
	require.NotContains(t, string(kv.Kvs[0].Value), secret, "still in plaintext after the load")
	c.addAgent("node-a", 0, nil)
	c.waitJobState("legacy", succeeded)
	require.Equal(t, secret, c.record("legacy", "node-a", 1).Env["JOB_SECRET"])
}
