package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckPath(t *testing.T) {
	tests := []struct {
		name string
		p    string
		dir  string
		// want is the error's text, "" for none.
		want string
	}{
		{name: "absolute clean", p: "/ckpt/step-10"},
		{name: "no dir: anywhere absolute", p: "/etc"},
		{name: "root", p: "/"},
		{name: "inside", p: "/ckpt/job/step-10", dir: "/ckpt/job"},
		{name: "deep inside", p: "/ckpt/job/a/b/step-10", dir: "/ckpt/job"},
		{name: "a name starting with two dots is inside", p: "/ckpt/..step-10", dir: "/ckpt"},
		{name: "a name of three dots is inside", p: "/ckpt/...", dir: "/ckpt"},
		{name: "dir given unclean", p: "/ckpt/step-10", dir: "/ckpt/"},
		{name: "empty", p: "", want: `path: must be an absolute path (got "")`},
		{name: "relative", p: "ckpt/step-10", want: `path: must be an absolute path (got "ckpt/step-10")`},
		{name: "dot relative", p: "./step-10", want: `path: must be an absolute path (got "./step-10")`},
		{name: "dot dot", p: "/ckpt/../etc", want: `path: must be a clean path without '..', '.' or repeated '/' elements, as "/etc" (got "/ckpt/../etc")`},
		{name: "dot", p: "/ckpt/./step-10", want: `path: must be a clean path without '..', '.' or repeated '/' elements, as "/ckpt/step-10" (got "/ckpt/./step-10")`},
		{name: "trailing slash", p: "/ckpt/", want: `path: must be a clean path without '..', '.' or repeated '/' elements, as "/ckpt" (got "/ckpt/")`},
		{name: "double slash", p: "/ckpt//step-10", want: `path: must be a clean path without '..', '.' or repeated '/' elements, as "/ckpt/step-10" (got "/ckpt//step-10")`},
		{name: "the dir itself", p: "/ckpt", dir: "/ckpt", want: `path: must be inside /ckpt (got "/ckpt")`},
		{name: "the dir's parent", p: "/", dir: "/ckpt", want: `path: must be inside /ckpt (got "/")`},
		{name: "a sibling sharing a prefix", p: "/ckpt-evil/step-10", dir: "/ckpt", want: `path: must be inside /ckpt (got "/ckpt-evil/step-10")`},
		{name: "elsewhere", p: "/etc/shadow", dir: "/ckpt", want: `path: must be inside /ckpt (got "/etc/shadow")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fe := CheckPath("path", tt.p, tt.dir)
			if tt.want == "" {
				require.Nil(t, fe)
				return
			}
			require.NotNil(t, fe)
			require.Equal(t, tt.want, fe.Error())
		})
	}
}

func TestWithin(t *testing.T) {
	tests := []struct {
		dir, path string
		want      bool
	}{
		{"/ckpt", "/ckpt/step-10", true},
		{"/ckpt", "/ckpt/..step-10", true},
		{"/ckpt", "/ckpt/a/../step-10", true},
		{"/ckpt", "/ckpt", false},
		{"/ckpt", "/ckpt/..", false},
		{"/ckpt", "/ckpt/../x", false},
		{"/ckpt", "/ckpt-evil", false},
		{"/ckpt", "/", false},
		{"/", "/ckpt", true},
	}
	for _, tt := range tests {
		t.Run(tt.dir+" "+tt.path, func(t *testing.T) {
			require.Equal(t, tt.want, Within(tt.dir, tt.path))
		})
	}
}
