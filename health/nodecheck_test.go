package health_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdzv/rdzv/health"
)

func TestCheckNext(t *testing.T) {
	t0 := time.Unix(1000, 0)
	t1, t2 := t0.Add(time.Minute), t0.Add(2*time.Minute)
	first := health.Check{Name: "storage"}.Next(true, "", t0)
	require.Equal(t, health.Check{Name: "storage", OK: true, Since: t0}, first)

	failing := first.Next(false, "full", t1)
	require.Equal(t, t1, failing.Since, "a flip moves since")
	still := failing.Next(false, "still full", t2)
	require.Equal(t, t1, still.Since, "a repeated failure keeps since")
	require.Equal(t, "still full", still.Message)
	back := still.Next(true, "ignored when ok", t2)
	require.Equal(t, t2, back.Since)
	require.Empty(t, back.Message)
}

func TestEligibleAndStopsRunningJob(t *testing.T) {
	ok := health.Check{Name: "network", OK: true}
	soft := health.Check{Name: "storage", Message: "full"}
	critical := health.Check{Name: "gpu", Critical: true, Message: "7 GPUs present, expected 8"}
	for _, tc := range []struct {
		name     string
		checks   []health.Check
		eligible bool
		stop     bool
		summary  string
	}{
		{"none", nil, true, false, ""},
		{"all pass", []health.Check{ok}, true, false, ""},
		{"soft failure", []health.Check{ok, soft}, false, false, "storage: full"},
		{"critical failure", []health.Check{critical, soft}, false, true, "gpu: 7 GPUs present, expected 8; storage: full"},
		{"critical check passing", []health.Check{{Name: "gpu", OK: true, Critical: true}}, true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.eligible, health.Eligible(tc.checks))
			stop, why := health.StopsRunningJob(tc.checks)
			require.Equal(t, tc.stop, stop)
			if stop {
				require.Contains(t, why, "gpu: ")
			}
			require.Equal(t, tc.summary, health.Summary(tc.checks))
		})
	}
}

func TestGPUPolicyJudge(t *testing.T) {
	good := func(i uint32) health.GPUState { return health.GPUState{Index: i, UUID: "GPU-x", TemperatureC: 60} }
	policy := health.GPUPolicy{ExpectedCount: 2, MaxTemperatureC: 85, RequirePersistence: true}
	for _, tc := range []struct {
		name           string
		policy         health.GPUPolicy
		states         []health.GPUState
		critical, soft []string
	}{
		{"healthy", policy, []health.GPUState{good(0), good(1)}, nil, nil},
		{"one missing", policy, []health.GPUState{good(0)}, []string{"1 GPUs present, expected 2"}, nil},
		{"ecc", policy, []health.GPUState{good(0), func() health.GPUState { g := good(1); g.UncorrectableECC = 3; return g }()},
			[]string{"GPU 1 (GPU-x): 3 uncorrectable ECC errors since the driver loaded"}, nil},
		{"retired pages and row remaps", policy, []health.GPUState{good(0), func() health.GPUState {
			g := good(1)
			g.RetiredPagesPending, g.RowRemapFailed, g.RowRemapPending = true, true, true
			return g
		}()}, []string{"GPU 1 (GPU-x): retired pages pending, needs a reset", "GPU 1 (GPU-x): row remapping failed", "GPU 1 (GPU-x): row remapping pending, needs a reset"}, nil},
		{"hot and throttled", policy, []health.GPUState{good(0), func() health.GPUState {
			g := good(1)
			g.TemperatureC, g.ThrottleReasons = 90, health.ThrottleHWThermal|0x1 // 0x1: idle, not a fault
			return g
		}()}, nil, []string{"GPU 1 (GPU-x): 90 C, limit 85 C", "GPU 1 (GPU-x): clocks throttled (hardware thermal slowdown)"}},
		{"persistence off", policy, []health.GPUState{good(0), func() health.GPUState { g := good(1); g.PersistenceDisabled = true; return g }()},
			nil, []string{"GPU 1 (GPU-x): persistence mode off"}},
		{"persistence not required, no temperature limit", health.GPUPolicy{ExpectedCount: 1},
			[]health.GPUState{{UUID: "GPU-x", PersistenceDisabled: true, TemperatureC: 99}}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			critical, soft := tc.policy.Judge(tc.states)
			require.Equal(t, tc.critical, critical)
			require.Equal(t, tc.soft, soft)
		})
	}
}
