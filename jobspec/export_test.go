package jobspec

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// A job exported from the controller's record is a job.yaml that parses,
// validates and submits the same spec: export → edit → start. Secret
// values the controller withholds are left out and named.
func TestExportRoundTrip(t *testing.T) {
	files, err := filepath.Glob("../examples/launchers/*.yaml")
	require.NoError(t, err)
	files = append(files, "../examples/job.yaml")
	jobs := map[string][]byte{
		"good": []byte(goodJob),
		"secrets": []byte("name: s\nnodes: 1\ncommand: [train.py]\nsecret_env: {TOKEN: hunter2}\nenv_files: {KEY: /etc/key}\n" +
			"restart: {max_restarts: 0}\nhealth: {preflight: {min_bandwidth_mbps: 2.5}}\n"),
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		jobs[filepath.Base(f)] = data
	}
	for name, data := range jobs {
		t.Run(name, func(t *testing.T) {
			spec, err := ParseIn(data, "/jobs")
			require.NoError(t, err)
			require.NoError(t, spec.Validate())
			stored := spec.ToProto()
			exported, err := Export(RedactSpec(stored))
			require.NoError(t, err)
			y, err := exported.YAML()
			require.NoError(t, err)
			back, err := Parse(y)
			require.NoError(t, err, "%s", y)
			require.NoError(t, back.Validate(), "%s", y)
			want := proto.CloneOf(stored)
			for _, k := range exported.Withheld {
				delete(want.SecretEnv, k)
			}
			if len(want.SecretEnv) == 0 {
				want.SecretEnv = nil
			}
			require.True(t, proto.Equal(want, back.ToProto()), "want %v\ngot  %v\n%s", want, back.ToProto(), y)
			// The JSON says the same.
			fromJSON, err := Parse(exported.JSON)
			require.NoError(t, err)
			require.True(t, proto.Equal(back.ToProto(), fromJSON.ToProto()))
		})
	}
	exported, err := Export(RedactSpec(mustParse(t, jobs["secrets"]).ToProto()))
	require.NoError(t, err)
	require.Equal(t, []string{"TOKEN"}, exported.Withheld)
	y, err := exported.YAML()
	require.NoError(t, err)
	require.NotContains(t, string(y), "hunter2")
	require.Contains(t, string(y), "secret_env TOKEN: values withheld")
}

func mustParse(t *testing.T, data []byte) *Spec {
	t.Helper()
	s, err := Parse(data)
	require.NoError(t, err)
	return s
}
