package buildinfo

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGet(t *testing.T) {
	for _, tc := range []struct {
		name, version, commit string
		wantVersion           string
		wantCommit            string
	}{
		{name: "ldflags", version: "v1.2.3", commit: "abc123", wantVersion: "v1.2.3", wantCommit: "abc123"},
		// go test builds carry no module version and no VCS stamp.
		{name: "unset", wantVersion: "dev", wantCommit: "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(v, c string) { Version, Commit = v, c }(Version, Commit)
			Version, Commit = tc.version, tc.commit
			info := Get()
			require.Equal(t, tc.wantVersion, info.Version)
			require.Equal(t, tc.wantCommit, info.Commit)
			require.Contains(t, info.String(), tc.wantVersion)
			require.NotEmpty(t, info.GoVersion)
		})
	}
}
