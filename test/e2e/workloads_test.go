package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/rdzv/rdzv/jobspec"
)

// The seed workloads of examples/workloads (see docs/workloads.md), each
// trained for real by its framework on torch 2.x from RDZV_VENV: a node is
// killed once the job has recorded a checkpoint, and the job must resume on
// the two left from the framework's own newest complete checkpoint, its
// loss carrying on from where that checkpoint left it, and train to the end.

const (
	// workloadSteps steps with a checkpoint every workloadCheckpointEvery;
	// the fault comes once the checkpoint of step 2×workloadCheckpointEvery
	// is recorded, with workloadStepTime seconds a step still to go.
	workloadSteps           = 60
	workloadCheckpointEvery = 10
	workloadStepTime        = "0.25"
	// workloadTimeout bounds a generation's start and run: importing
	// DeepSpeed or Transformers on every worker of two busy cores takes
	// minutes. It only keeps a hang from stalling the run.
	workloadTimeout = 10 * time.Minute
	// workloadsEnv selects the workloads beyond the default set: "all", or
	// names separated by commas (make e2e-workloads sets "all").
	workloadsEnv = "RDZV_WORKLOADS"
)

// workload is one seed run one way: examples/workloads/<dir>/job.yaml,
// changed by edit.
type workload struct {
	name string
	dir  string
	// heavy ones run only when RDZV_WORKLOADS asks for them: they would
	// take make test past its budget on two cores.
	heavy bool
	// sameWorld keeps the world size across the fault: two nodes of the
	// three, the third taking the killed one's place. DeepSpeed loads a
	// ZeRO checkpoint only into as many ranks as saved it.
	sameWorld bool
	edit      func(spec map[string]any, venv string)
}

// warmWorkload runs the seed from warm standbys of the venv's python with
// preload imported, instead of its launcher.
func warmWorkload(preload ...string) func(spec map[string]any, venv string) {
	return func(spec map[string]any, venv string) {
		spec["launcher"] = map[string]any{"kind": "warm", "python": filepath.Join(venv, "bin", "python"),
			"preload": append(toAny(jobspec.DefaultPreload), toAny(preload)...)}
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// zero3 makes the DeepSpeed seed run ZeRO stage 3.
func zero3(spec map[string]any, _ string) {
	cmd := spec["command"].([]any)
	i := slices.Index(cmd, any("--zero-stage"))
	cmd[i+1] = "3"
}

var workloads = []workload{
	{name: "ddp-mingpt", dir: "ddp_mingpt"},
	{name: "ddp-mingpt-warm", dir: "ddp_mingpt", heavy: true, edit: warmWorkload()},
	{name: "fsdp", dir: "fsdp"},
	{name: "fsdp-warm", dir: "fsdp", heavy: true, edit: warmWorkload()},
	{name: "deepspeed-zero2", dir: "deepspeed", sameWorld: true},
	{name: "deepspeed-zero3", dir: "deepspeed", heavy: true, sameWorld: true, edit: zero3},
	{name: "deepspeed-zero2-warm", dir: "deepspeed", heavy: true, sameWorld: true, edit: warmWorkload("deepspeed")},
	{name: "hf-gpt2", dir: "hf_gpt2", heavy: true},
	{name: "hf-gpt2-warm", dir: "hf_gpt2", heavy: true, edit: warmWorkload("transformers")},
}

func TestWorkloads(t *testing.T) {
	venv := os.Getenv("RDZV_VENV")
	if venv == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("e2e: RDZV_VENV is not set: CI must run the workloads on torch 2.x (make e2e sets it to .venv, made by make venv)")
		}
		t.Skip("e2e: RDZV_VENV is not set: the workloads need the torch 2.x venv with DeepSpeed, Accelerate and Transformers; run `make venv` and `make e2e`, or set RDZV_VENV to such a venv")
	}
	venv, err := filepath.Abs(venv)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(venv, "bin", "python"), "RDZV_VENV=%s is not a venv", venv)
	selected := strings.Split(os.Getenv(workloadsEnv), ",")
	for _, w := range workloads {
		t.Run(w.name, func(t *testing.T) {
			if w.heavy && !slices.Contains(selected, "all") && !slices.Contains(selected, w.name) {
				t.Skipf("e2e: %s is not in the default set; run it with make e2e-workloads or %s=%s", w.name, workloadsEnv, w.name)
			}
			testWorkload(t, w, venv)
		})
	}
}

func testWorkload(t *testing.T, w workload, venv string) {
	begin := time.Now()
	c := newFaultCluster(t)
	path, ckptDir := workloadJob(t, c, w, venv)
	c.job = w.name
	c.ctlOK(t, "start", path)
	before := c.waitCheckpointWithin(t, w.name, 2*workloadCheckpointEvery, workloadTimeout)
	started := time.Now()

	// The node killed is never rank 0's (h1), whose log has the losses of
	// both generations.
	killed, survivors := 2, agentNames(c)[:2]
	if w.sameWorld {
		killed, survivors = 1, []string{c.agentHost(0).Name, c.agentHost(2).Name}
	}
	c.killHost(t, killed)
	t.Logf("e2e: SIGKILLed everything on %s %s after the start (latest checkpoint then: step %d, %s)",
		c.agentHost(killed).Name, started.Sub(begin).Round(time.Second), before.LatestCheckpoint.Step, before.LatestCheckpoint.Path)
	c.waitNodeState(t, killed, "NODE_STATE_LOST")

	j := c.waitJobWithin(t, w.name, "finished", workloadTimeout, func(j jobJSON) bool { return finished(j.State) })
	require.Equal(t, "JOB_STATE_SUCCEEDED", j.State, "reason: %s", j.Reason)
	require.EqualValues(t, 2, j.Generation, "one restart, after the fault")
	events := c.jobEvents(t, w.name)
	rounds := parseRounds(t, events)
	require.Equal(t, survivors, rounds[2].nodes, "generation 2 runs on the nodes left")

	// The framework's newest complete checkpoint recorded by generation 1.
	var latest uint64
	var latestPath string
	for _, ev := range events {
		if ev.Kind != "checkpoint_recorded" || ev.Generation != 1 {
			continue
		}
		m := checkpointMessage.FindStringSubmatch(ev.Message)
		require.NotNil(t, m, "unexpected checkpoint_recorded message: %q", ev.Message)
		if step := uint64(atoi(t, m[1])); step >= latest {
			latest, latestPath = step, m[2]
		}
	}
	resume := rounds[2].resume
	require.GreaterOrEqual(t, resume, before.LatestCheckpoint.Step, "generation 2 resumed from a checkpoint older than the one recorded before the fault")
	require.Equal(t, latest, resume, "generation 2 did not resume from generation 1's newest complete checkpoint")
	require.Equal(t, ckptDir, filepath.Dir(latestPath), "the checkpoint is not in the job's checkpoint.dir")

	// Rank 0 (on h1, which survives) prints the world's loss every step.
	log := c.nodeLog(t, 0, w.name)
	loss := map[uint64]map[int]float64{}
	for _, f := range taggedLines(log, "RDZV_LOSS") {
		gen := uint64(atoi(t, f["generation"]))
		if loss[gen] == nil {
			loss[gen] = map[int]float64{}
		}
		v, err := strconv.ParseFloat(f["loss"], 64)
		require.NoError(t, err, "%v", f)
		loss[gen][atoi(t, f["step"])] = v
	}
	resumed := taggedLines(log, "RDZV_RESUMED")
	require.Len(t, resumed, 1, "one resume, by rank 0 of generation 2")
	require.Equal(t, "2", resumed[0]["generation"])
	require.Equal(t, strconv.FormatUint(resume, 10), resumed[0]["step"], "generation 2 loaded another step than rdzv chose")
	require.Equal(t, latestPath, strings.TrimRight(resumed[0]["path"], "/"), "generation 2 loaded another checkpoint than rdzv chose")

	s := int(resume)
	initial, ok := loss[1][1]
	require.True(t, ok, "generation 1 logged no loss at step 1: %v", loss[1])
	atCheckpoint, ok := loss[1][s]
	require.True(t, ok, "generation 1 logged no loss at the checkpoint's step %d", s)
	first := slices.Min(keys(loss[2]))
	require.Equal(t, s+1, first, "generation 2 did not train on from the step after its checkpoint")
	after := loss[2][first]
	// Training had made progress by the checkpoint, and the loss after the
	// resume carries on from there: nearer the loss at the checkpoint than
	// the untrained model's. A restart from scratch, or from weights that
	// were not restored, starts back near the initial loss.
	require.Less(t, atCheckpoint, initial-0.3, "generation 1 barely trained by step %d: loss %.4f from %.4f", s, atCheckpoint, initial)
	require.Less(t, after, atCheckpoint+(initial-atCheckpoint)/2,
		"the loss after the resume (%.4f at step %d) is back towards the initial %.4f, not on from %.4f at step %d", after, first, initial, atCheckpoint, s)
	require.Equal(t, workloadSteps, slices.Max(keys(loss[2])), "generation 2 did not train to the end")
	done := taggedLines(log, "RDZV_DONE")
	require.NotEmpty(t, done)
	require.Equal(t, "2", done[len(done)-1]["generation"])
	require.Equal(t, strconv.Itoa(workloadSteps), done[len(done)-1]["steps"])
	requireIdle(t, c)

	// Figures, not assertions.
	same := "-"
	if v, ok := loss[1][s+1]; ok {
		same = fmt.Sprintf("%.4f", v)
	}
	t.Logf("e2e: figures: %s: loss %.4f at step 1, %.4f at step %d (checkpoint); after the resume %.4f at step %d (generation 1 had %s there); final %.4f at step %d; wall %s",
		w.name, initial, atCheckpoint, s, after, first, same, loss[2][workloadSteps], workloadSteps, time.Since(begin).Round(time.Second))
}

func keys(m map[int]float64) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// workloadJob writes the seed's job.yaml adapted to the test cluster: 2 to
// 3 nodes, its workdir examples/workloads, the venv's programs and the rdzv
// package found by the workers, a checkpoint directory of the test's, the
// run stretched so that the fault lands mid-training, and the fault tests'
// restart policy. It returns the file and the checkpoint directory.
func workloadJob(t *testing.T, c *cluster, w workload, venv string) (path, ckptDir string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	workdir := filepath.Join(root, "examples", "workloads")
	data, err := os.ReadFile(filepath.Join(workdir, w.dir, "job.yaml"))
	require.NoError(t, err)
	spec := map[string]any{}
	require.NoError(t, yaml.Unmarshal(data, &spec))
	ckptDir = filepath.Join(c.dir, "ckpt")
	spec["name"] = w.name
	spec["nodes"] = map[string]any{"min": 2, "max": agentHosts}
	if w.sameWorld {
		spec["nodes"] = map[string]any{"min": 2, "max": 2}
	}
	spec["workdir"] = workdir
	spec["checkpoint"] = map[string]any{"dir": ckptDir}
	cmd, _ := spec["command"].([]any)
	require.Contains(t, cmd, any("--steps"), "%s/job.yaml: command has no --steps", w.dir)
	cmd[slices.Index(cmd, any("--steps"))+1] = strconv.Itoa(workloadSteps)
	require.Contains(t, cmd, any("--checkpoint-every"), "%s/job.yaml: command has no --checkpoint-every", w.dir)
	cmd[slices.Index(cmd, any("--checkpoint-every"))+1] = strconv.Itoa(workloadCheckpointEvery)
	spec["command"] = append(cmd, "--step-time", workloadStepTime)
	spec["env"] = map[string]any{
		"OMP_NUM_THREADS": "1",
		// The venv's torchrun, deepspeed, accelerate and python first.
		"PATH": filepath.Join(venv, "bin") + ":/usr/local/bin:/usr/bin:/bin",
		// The rdzv package from this tree; workers get none of the test's
		// environment, and must not write bytecode into it.
		"PYTHONPATH":              filepath.Join(root, "python", "src"),
		"PYTHONDONTWRITEBYTECODE": "1",
		// Nothing may be fetched: the hosts have no network beyond their own.
		"HF_HUB_OFFLINE": "1",
	}
	spec["restart"] = map[string]any{"max_restarts": 3, "backoff": map[string]any{"initial": "500ms", "max": "5s"}}
	spec["rendezvous"] = map[string]any{"last_call": "1s", "timeout": "2m"}
	if w.edit != nil {
		w.edit(spec, venv)
	}
	data, err = yaml.Marshal(spec)
	require.NoError(t, err)
	path = filepath.Join(c.dir, w.name+".yaml")
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path, ckptDir
}
