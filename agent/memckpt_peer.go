package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/wire"
)

// The agents' peer listener: mutual TLS, agent certificates of the cluster
// CA only (pki.Reloader.AgentPeerServerConfig). Before a peer's certificate
// is verified it can make the agent read no more than crypto/tls takes of
// a handshake, within peerHeaderTimeout; after, a request's line and
// headers are bounded by maxPeerHeaderBytes and its body by the job's
// checkpoint.memory.max_bytes, checked against its Content-Length before
// anything of it is read or allocated.
//
//	PUT /v1/shards/JOB/GEN/STEP/RANK   a replica, header Rdzv-Sha256 (hex)
//	GET /v1/shards/JOB/GEN/STEP/RANK   a shard held here, with Rdzv-Sha256
const (
	shardPathPrefix    = "/v1/shards/"
	shardSumHeader     = "Rdzv-Sha256"
	maxPeerHeaderBytes = 4 << 10
	peerHeaderTimeout  = 5 * time.Second
	// peerTimeout bounds one shard's transfer, either way.
	peerTimeout = 5 * time.Minute
	// DefaultPeerPort is the agent's peer listener's port by default.
	DefaultPeerPort = 7947
)

// shardRef is a shard named in a peer request's path.
type shardRef struct {
	job string
	key shardKey
}

// parseShardPath reads JOB/GEN/STEP/RANK after shardPathPrefix.
func parseShardPath(p string) (shardRef, error) {
	rest, ok := strings.CutPrefix(p, shardPathPrefix)
	if !ok {
		return shardRef{}, fmt.Errorf("path must start with %s", shardPathPrefix)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 {
		return shardRef{}, errors.New("path must be " + shardPathPrefix + "JOB/GENERATION/STEP/RANK")
	}
	if fe := wire.ValidateName("job", parts[0]); fe != nil {
		return shardRef{}, fe
	}
	var nums [3]uint64
	for i, name := range []string{"generation", "step", "rank"} {
		bits := 64
		if name == "rank" {
			bits = 32
		}
		n, err := strconv.ParseUint(parts[i+1], 10, bits)
		if err != nil || (len(parts[i+1]) > 1 && parts[i+1][0] == '0') {
			return shardRef{}, fmt.Errorf("%s: must be a decimal number, got %s", name, wire.Quote(parts[i+1]))
		}
		nums[i] = n
	}
	return shardRef{job: parts[0], key: shardKey{nums[0], nums[1], uint32(nums[2])}}, nil
}

func shardPath(job string, k shardKey) string {
	return fmt.Sprintf("%s%s/%d/%d/%d", shardPathPrefix, job, k.gen, k.step, k.rank)
}

// parseShardSum reads the Rdzv-Sha256 header's values: exactly one, 64
// hex digits.
func parseShardSum(values []string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if len(values) != 1 {
		return sum, fmt.Errorf("%s: expected one header, got %d", shardSumHeader, len(values))
	}
	b, err := hex.DecodeString(values[0])
	if err != nil || len(b) != sha256.Size {
		return sum, fmt.Errorf("%s: expected %d hex digits", shardSumHeader, 2*sha256.Size)
	}
	copy(sum[:], b)
	return sum, nil
}

// peerServer answers other agents on the peer listener.
type peerServer struct {
	srv *http.Server
}

func newPeerServer(store *memStore, conf *tls.Config, log *zap.Logger) *peerServer {
	h := &peerHandler{store: store, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT "+shardPathPrefix, h.put)
	mux.HandleFunc("GET "+shardPathPrefix, h.get)
	return &peerServer{srv: &http.Server{
		Handler: mux, TLSConfig: conf,
		// Also the TLS handshake's deadline (net/http).
		ReadHeaderTimeout: peerHeaderTimeout,
		ReadTimeout:       peerTimeout,
		WriteTimeout:      peerTimeout,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    maxPeerHeaderBytes,
		ErrorLog:          zap.NewStdLog(log),
	}}
}

func (p *peerServer) serve(ln net.Listener) error {
	if err := p.srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving agent peers: %w", err)
	}
	return nil
}

func (p *peerServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), reportShutdown)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		_ = p.srv.Close()
	}
}

type peerHandler struct {
	store *memStore
	log   *zap.Logger
}

func (h *peerHandler) put(w http.ResponseWriter, r *http.Request) {
	ref, err := parseShardPath(r.URL.Path)
	if err != nil {
		h.refuse(w, http.StatusBadRequest, err)
		return
	}
	sum, err := parseShardSum(r.Header.Values(shardSumHeader))
	if err != nil {
		h.refuse(w, http.StatusBadRequest, err)
		return
	}
	limit := h.store.limit(ref.job)
	switch {
	case limit == 0:
		h.refuse(w, http.StatusNotFound, fmt.Errorf("job %s: %w", ref.job, errMemOff))
		return
	case r.ContentLength < 0:
		h.refuse(w, http.StatusLengthRequired, errors.New("Content-Length is required"))
		return
	case r.ContentLength > limit:
		h.refuse(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%d bytes: %w (%d)", r.ContentLength, errShardTooBig, limit))
		return
	}
	data := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(r.Body, data); err != nil {
		h.refuse(w, http.StatusBadRequest, fmt.Errorf("reading shard: %w", err))
		return
	}
	if err := h.store.receive(ref.job, ref.key, data, sum); err != nil {
		status := http.StatusBadRequest
		switch {
		case errors.Is(err, errMemOff):
			status = http.StatusNotFound
		case errors.Is(err, errShardTooBig):
			status = http.StatusRequestEntityTooLarge
		}
		h.refuse(w, status, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *peerHandler) get(w http.ResponseWriter, r *http.Request) {
	ref, err := parseShardPath(r.URL.Path)
	if err != nil {
		h.refuse(w, http.StatusBadRequest, err)
		return
	}
	data, sum, err := h.store.get(ref.job, ref.key)
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, errShardMissing) {
			status = http.StatusNotFound
		}
		h.refuse(w, status, err)
		return
	}
	w.Header().Set(shardSumHeader, hex.EncodeToString(sum[:]))
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	_, _ = w.Write(data)
}

func (h *peerHandler) refuse(w http.ResponseWriter, status int, err error) {
	h.log.Debug("peer request refused", zap.Int("status", status), zap.Error(err))
	w.Header().Set("Connection", "close")
	http.Error(w, err.Error(), status)
}

// peerClient is an HTTP client for one peer, over conf. Its connection is
// kept between requests, for at most peerIdle idle: a replica a step, each
// over a connection of its own, cost a TLS handshake at both ends per
// shard.
func peerClient(conf *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: conf, ForceAttemptHTTP2: false,
		MaxIdleConnsPerHost: 1, IdleConnTimeout: peerIdle,
		TLSHandshakeTimeout: peerHeaderTimeout, ResponseHeaderTimeout: peerTimeout}}
}

const (
	// peerIdle is how long a client keeps an idle connection to a peer,
	// under the peer server's IdleTimeout.
	peerIdle = 30 * time.Second
	// peerClientAge is how long a client is used before a new one (new
	// connections, a new handshake) replaces it: a peer whose certificate
	// was revoked since it was verified is not sent shards for longer.
	peerClientAge = time.Minute
)

// peerClients keeps one client per peer node, so that connections are
// reused (peerClient), each replaced after peerClientAge. Its lock guards
// the map only: requests run outside it.
type peerClients struct {
	mu   sync.Mutex
	byID map[string]peerClientEntry
}

type peerClientEntry struct {
	client *http.Client
	made   time.Time
}

// get is the client for node at now, over conf(node) when a new one is
// made. Clients past their age, node's and any other's, are dropped,
// their idle connections closed.
func (p *peerClients) get(node string, conf func(string) *tls.Config, now time.Time) *http.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, e := range p.byID {
		if now.Sub(e.made) >= peerClientAge {
			e.client.CloseIdleConnections()
			delete(p.byID, id)
		}
	}
	if e, ok := p.byID[node]; ok {
		return e.client
	}
	if p.byID == nil {
		p.byID = map[string]peerClientEntry{}
	}
	c := peerClient(conf(node))
	p.byID[node] = peerClientEntry{client: c, made: now}
	return c
}

// closeAll closes every client's idle connections and forgets them.
func (p *peerClients) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, e := range p.byID {
		e.client.CloseIdleConnections()
		delete(p.byID, id)
	}
}

// pushShard sends k's shard of job to the peer at addr.
func pushShard(ctx context.Context, client *http.Client, addr, job string, k shardKey, data []byte, sum [sha256.Size]byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "https://"+addr+shardPath(job, k), bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set(shardSumHeader, hex.EncodeToString(sum[:]))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		reason, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("peer answered %d: %s", resp.StatusCode, strings.TrimSpace(string(reason)))
	}
	return nil
}

// fetchShard gets k's shard of job from the peer at addr, at most limit
// bytes of it, checked against the checksum the peer sends.
func fetchShard(ctx context.Context, client *http.Client, addr, job string, k shardKey, limit int64) ([]byte, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+shardPath(job, k), nil)
	if err != nil {
		return nil, sum, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, sum, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		reason, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, sum, fmt.Errorf("peer answered %d: %s", resp.StatusCode, strings.TrimSpace(string(reason)))
	}
	if sum, err = parseShardSum(resp.Header.Values(shardSumHeader)); err != nil {
		return nil, sum, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, sum, err
	}
	if int64(len(data)) > limit {
		return nil, sum, fmt.Errorf("%w (%d)", errShardTooBig, limit)
	}
	if sha256.Sum256(data) != sum {
		return nil, sum, errShardSum
	}
	return data, sum, nil
}
