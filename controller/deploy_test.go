package controller_test

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// The alerting rules and the Grafana dashboard in deploy/ name only
// metrics that the daemons export: scraped from a running controller, with
// a job on it so that its per-job series exist, and from a running agent.
// promtool (make lint) checks the rules' syntax when it is installed; this
// test runs everywhere.
func TestDeployFilesUseExistingMetrics(t *testing.T) {
	c := newCluster(t)
	ra := c.addAgent("node-a", 1, nil)
	c.startJob(c.spec("watched", 1, 1, "hang"))
	c.waitRunning("watched")

	code, body := getStatus(t, "http://"+ra.agent.HTTP().Addr().String()+"/readyz")
	require.Equal(t, http.StatusOK, code, "a registered agent is ready: %s", body)
	known := map[string]bool{}
	for _, e := range []exposition{scrape(t, c.httpAddr()), scrape(t, ra.agent.HTTP().Addr().String())} {
		for name, f := range e {
			known[name] = true
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				known[name+"_bucket"], known[name+"_sum"], known[name+"_count"] = true, true, true
			case dto.MetricType_SUMMARY:
				known[name+"_sum"], known[name+"_count"] = true, true
			}
		}
	}
	require.True(t, known["rdzv_job_effective_training_ratio"], "the controller's per-job series are there")
	require.True(t, known["rdzv_agent_workers_running"], "the agent's are there")

	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	data, err := os.ReadFile("../deploy/prometheus/rdzv-alerts.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(data, &rules))
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: a rule without a name", g.Name)
			require.Contains(t, []string{"critical", "warning"}, r.Labels["severity"], "alert %s: severity", r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], "alert %s: summary", r.Alert)
			checkExpr(t, "alert "+r.Alert, r.Expr, known)
			alerts[r.Alert] = true
		}
	}
	for _, want := range []string{"RdzvJobFailed", "RdzvNodeLost", "RdzvJobCrashLooping", "RdzvJobLowEffectiveTrainingTime", "RdzvNoLeader", "RdzvCertificateExpiring"} {
		require.True(t, alerts[want], "alert %s is missing", want)
	}

	var dash struct {
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	data, err = os.ReadFile("../deploy/grafana/rdzv.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &dash))
	graphs := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			checkExpr(t, "panel "+p.Title, tg.Expr, known)
		}
		graphs++
	}
	require.Positive(t, graphs)
}

// metricName matches the names of rdzv's own metrics and of the gRPC
// server metrics in a PromQL expression; label names never start so.
var metricName = regexp.MustCompile(`\b(?:rdzv|grpc_server)_[a-zA-Z0-9_]+`)

func checkExpr(t *testing.T, where, expr string, known map[string]bool) {
	t.Helper()
	names := metricName.FindAllString(expr, -1)
	require.NotEmpty(t, names, "%s: %q names no rdzv metric", where, expr)
	for _, n := range names {
		require.True(t, known[n], "%s: %q names %s, which no daemon exports", where, expr, n)
	}
}
