// Package testaddr gives tests loopback addresses.
package testaddr

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// Free is a loopback host:port that was free a moment ago: nothing listens
// on it, and a test may listen there.
func Free(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
