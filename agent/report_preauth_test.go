package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
)

// readCounter counts the bytes the report server reads from its
// connections.
type readCounter struct {
	net.Listener
	read atomic.Int64
}

type countedConn struct {
	net.Conn
	read *atomic.Int64
}

func (l *readCounter) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countedConn{Conn: conn, read: &l.read}, nil
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// reportPreauthBound is what the report server may read of a request
// without the workers' token: its headers (maxReportHeaderBytes, and 4 KiB
// net/http allows beyond) and a read buffer of slack.
const reportPreauthBound = maxReportHeaderBytes + 4<<10 + 8<<10

// TestUnauthenticatedReportIsNotRead sends large requests without the
// token and counts what the report server read of them: the headers, not
// the body, and the connection is closed after the refusal.
func TestUnauthenticatedReportIsNotRead(t *testing.T) {
	h := newSupervisor(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lis := &readCounter{Listener: ln}
	srv := newReportServer(h.sup, newAgentMetrics().reports, zaptest.NewLogger(t))
	served := make(chan error, 1)
	go func() { served <- srv.serve(lis) }()
	defer func() {
		srv.shutdown()
		require.NoError(t, <-served)
	}()

	const bodyBytes = 10 << 20
	guessed := bearer(make([]byte, reportTokenBytes))
	tests := []struct {
		name    string
		headers string
		want    int
	}{
		{"no token, 10 MB body", "", http.StatusUnauthorized},
		{"wrong token, 10 MB body", "Authorization: " + guessed + "\r\n", http.StatusForbidden},
		{"1 MB of headers", "X-Pad: " + strings.Repeat("x", 1<<20) + "\r\n", http.StatusRequestHeaderFieldsTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := lis.read.Load()
			conn, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer conn.Close()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				// Writes fail once the server closes the connection.
				defer wg.Done()
				_, _ = fmt.Fprintf(conn, "POST /v1/step HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n", bodyBytes, tt.headers)
				_, _ = io.Copy(conn, io.LimitReader(zeros{}, bodyBytes))
			}()
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			require.NoError(t, err)
			require.Equal(t, tt.want, resp.StatusCode)
			_, _ = io.Copy(io.Discard, resp.Body)
			// The server closes the connection: the read ends. It ends in
			// EOF, or in a reset where the server's close found our unread
			// body in its buffer before this read saw the FIN (net/http
			// waits 500 ms after its FIN; a loaded -race run is slower).
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Minute)))
			_, err = conn.Read(make([]byte, 1))
			if !errors.Is(err, syscall.ECONNRESET) {
				require.ErrorIs(t, err, io.EOF)
			}
			require.NoError(t, conn.Close())
			wg.Wait()
			read := lis.read.Load() - before
			t.Logf("%s: the report server read %d bytes", tt.name, read)
			require.Less(t, read, int64(reportPreauthBound))
		})
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
