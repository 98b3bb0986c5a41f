package store

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller/keyring"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// keyFile writes a key file of the given "ID BASE64" lines.
func keyFile(t *testing.T, lines ...string) *keyring.Keyring {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	k, err := keyring.Load(p)
	require.NoError(t, err)
	return k
}

func keyLine(id string, b byte) string {
	return id + " " + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(b), keyring.KeyBytes)))
}

func withSecret(name, secret string) *rdzvv1.Job {
	j := job(name, rdzvv1.JobState_JOB_STATE_PENDING, 0)
	j.Spec.SecretEnv = map[string]string{"HF_TOKEN": secret}
	return j
}

// secret_env values are sealed in etcd, opened on load, and a job not
// sealed with the primary key (plaintext from an older version, or an
// older key) is reported so that it is sealed again.
func TestSecretsSealedAtRest(t *testing.T) {
	const secret = "hf_s3cret-value"
	cli := startEtcd(t)
	oldKeys := keyFile(t, keyLine("old", 'o'))
	s := New(cli, 0, oldKeys, 0)
	s.Lead(lead(t, cli, "test"))

	commit(t, s, s.CreateJob(withSecret("sealed", secret), false))
	raw, err := cli.Get(ctx(t), JobKey("sealed"))
	require.NoError(t, err)
	require.NotContains(t, string(raw.Kvs[0].Value), secret, "the secret is stored in plaintext")
	var stored rdzvv1.Job
	require.NoError(t, proto.Unmarshal(raw.Kvs[0].Value, &stored))
	require.True(t, strings.HasPrefix(stored.GetSpec().GetSecretEnv()["HF_TOKEN"], "rdzv-sealed:v1:old:"))

	// As an older version stored it: in plaintext.
	b, err := proto.Marshal(withSecret("legacy", secret))
	require.NoError(t, err)
	_, err = cli.Put(ctx(t), JobKey("legacy"), string(b))
	require.NoError(t, err)
	// Sealed for another job, copied here: must not open.
	_, err = cli.Put(ctx(t), JobKey("copied"), string(raw.Kvs[0].Value))
	require.NoError(t, err)

	snap, err := s.Load(ctx(t))
	require.NoError(t, err)
	require.Equal(t, secret, snap.Jobs["sealed"].Value.GetSpec().GetSecretEnv()["HF_TOKEN"])
	require.Equal(t, secret, snap.Jobs["legacy"].Value.GetSpec().GetSecretEnv()["HF_TOKEN"])
	require.Equal(t, []string{"legacy"}, snap.Unsealed)
	require.ErrorIs(t, snap.UnreadableJobs["copied"].Err, keyring.ErrOpen)
	require.NotContains(t, snap.Jobs, "copied")

	// Rotated: a new primary key, the old one still opens.
	rotated := New(cli, 0, keyFile(t, keyLine("new", 'n'), keyLine("old", 'o')), 0)
	snap, err = rotated.Load(ctx(t))
	require.NoError(t, err)
	require.Equal(t, secret, snap.Jobs["sealed"].Value.GetSpec().GetSecretEnv()["HF_TOKEN"])
	require.ElementsMatch(t, []string{"legacy", "sealed"}, snap.Unsealed)

	// The old key gone: the job cannot be read, and the error says why
	// without the value.
	snap, err = New(cli, 0, keyFile(t, keyLine("new", 'n')), 0).Load(ctx(t))
	require.NoError(t, err)
	bad := snap.UnreadableJobs["sealed"]
	require.ErrorIs(t, bad.Err, keyring.ErrUnknownKey)
	require.ErrorContains(t, bad.Err, "secret_env HF_TOKEN")
	require.NotContains(t, bad.Err.Error(), "rdzv-sealed")
	require.Equal(t, JobKey("sealed"), bad.Key)
	require.Positive(t, bad.ModRevision)
	require.NotContains(t, snap.Jobs, "sealed")
}

// A record that does not decode is reported, not fatal: one bad key must
// not keep every controller from leading.
func TestLoadReportsUnreadableRecords(t *testing.T) {
	s, cli := newStore(t)
	commit(t, s,
		s.CreateJob(job("good", rdzvv1.JobState_JOB_STATE_PENDING, 0), false),
		s.CommitRound(job("good", rdzvv1.JobState_JOB_STATE_RUNNING, 1), round("good", 1, "n1", "n2")),
		s.PutWorker("good", "n1", &rdzvv1.WorkerStatus{Job: "good", Generation: 1}),
		s.CreateJob(job("badround", rdzvv1.JobState_JOB_STATE_PENDING, 0), false),
		s.PutNode(&rdzvv1.Node{Info: &rdzvv1.NodeInfo{Name: "n1"}}),
	)

	garbage := "\xff\xff\xff"
	for _, key := range []string{
		NodeKey("n2"), JobKey("junk"), RoundKey("badround", 1), WorkerKey("good", "n2"),
		CheckpointKey("good", 5), NodesPrefix() + "a/b",
	} {
		_, err := cli.Put(ctx(t), key, garbage)
		require.NoError(t, err)
	}

	snap, err := s.Load(ctx(t))
	require.NoError(t, err)
	require.Contains(t, snap.Nodes, "n1")
	require.Contains(t, snap.UnreadableNodes, "n2")
	require.Contains(t, snap.Jobs, "good")
	require.Contains(t, snap.UnreadableJobs, "junk")
	require.Contains(t, snap.UnreadableJobs, "badround", "a job whose round cannot be read cannot be run")
	require.NotContains(t, snap.Jobs, "badround")
	require.Equal(t, uint64(1), snap.Rounds["good"].GetGeneration())
	require.Contains(t, snap.Workers["good"], "n1")
	require.NotContains(t, snap.Workers["good"], "n2")
	var dropped []string
	for _, d := range snap.Dropped {
		require.Error(t, d.Err)
		dropped = append(dropped, d.Key)
	}
	require.ElementsMatch(t, []string{WorkerKey("good", "n2"), CheckpointKey("good", 5), NodesPrefix() + "a/b"}, dropped)
}
