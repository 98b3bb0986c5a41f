package client

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseAddrs(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "10.0.0.1:7070", want: []string{"10.0.0.1:7070"}},
		{in: "a:7070, b:7070", want: []string{"a:7070", "b:7070"}},
		{in: "", wantErr: `--controller: "" is not host:port`},
		{in: "a:7070,b", wantErr: `--controller: "b" is not host:port`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseAddrs("--controller", tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}
