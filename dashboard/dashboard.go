// Package dashboard is rdzv's read-only web dashboard: the cluster
// overview, a page per job (with the timeline of each incident) and per
// node, updated live from the event stream. It reads through Source (the
// controller's API, in process or over gRPC) and can change nothing: it
// serves GET and HEAD only and calls read methods only. Assets are
// embedded; pages load nothing from elsewhere.
//
// It has no authentication of its own: serve it on loopback (the
// default), or behind the operator's client certificates.
package dashboard

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// Source is what the dashboard reads: the read methods of the rdzv API.
type Source interface {
	ListNodes(ctx context.Context, req *rdzvv1.ListNodesRequest) (*rdzvv1.ListNodesResponse, error)
	SummarizeNodes(ctx context.Context, req *rdzvv1.SummarizeNodesRequest) (*rdzvv1.SummarizeNodesResponse, error)
	ListJobs(ctx context.Context, req *rdzvv1.ListJobsRequest) (*rdzvv1.ListJobsResponse, error)
	GetJob(ctx context.Context, req *rdzvv1.GetJobRequest) (*rdzvv1.GetJobResponse, error)
	ListEvents(ctx context.Context, req *rdzvv1.ListEventsRequest) (*rdzvv1.ListEventsResponse, error)
	// WatchEvents calls send with each message of a watch until ctx ends,
	// send fails, or the watch ends (with its error).
	WatchEvents(ctx context.Context, req *rdzvv1.WatchEventsRequest, send func(*rdzvv1.WatchEventsResponse) error) error
}

//go:embed assets
var assets embed.FS

var pages = template.Must(template.New("").Funcs(funcs).ParseFS(assets, "assets/*.html"))

const (
	// readTimeout bounds the API calls behind one page.
	readTimeout = 10 * time.Second
	// maxNodesShown and maxJobsShown bound the overview's tables (one
	// page of each list); the counts above them are of every node.
	maxNodesShown = 1000
	maxJobsShown  = 200
	// jobEvents is how many of a job's newest events its page shows.
	jobEvents = 200
)

type handler struct {
	src Source
	log *zap.Logger
	mux *http.ServeMux
}

// New is the dashboard over src.
func New(src Source, log *zap.Logger) http.Handler {
	h := &handler{src: src, log: log, mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		panic(fmt.Sprintf("embedded assets: %v", err)) // the embed directive guarantees it
	}
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /jobs/{name}", h.job)
	h.mux.HandleFunc("GET /nodes/{name}", h.node)
	h.mux.HandleFunc("GET /events", h.events)
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Read-only: nothing but GET (and HEAD, which the mux answers as GET
	// without a body) is served, whatever the path.
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the dashboard is read-only", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
	h.mux.ServeHTTP(w, r)
}

// render writes a page, or says why it cannot.
func (h *handler) render(w http.ResponseWriter, name string, data any, err error) {
	if err != nil {
		h.fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pages.ExecuteTemplate(w, name, data); err != nil {
		h.log.Warn("rendering a page failed", zap.String("page", name), zap.Error(err))
	}
}

func (h *handler) fail(w http.ResponseWriter, err error) {
	code := http.StatusBadGateway
	switch status.Code(err) {
	case codes.NotFound, codes.InvalidArgument:
		code = http.StatusNotFound
	}
	if errors.Is(err, errBadName) {
		code = http.StatusNotFound
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_ = pages.ExecuteTemplate(w, "error.html", map[string]any{"Title": http.StatusText(code), "Error": err.Error()})
}

var errBadName = errors.New("not a name")

// name is a path's {name}, checked as the API checks names.
func name(r *http.Request, field string) (string, error) {
	n := r.PathValue("name")
	if fe := wire.ValidateName(field, n); fe != nil {
		return "", fmt.Errorf("%w: %w", errBadName, fe)
	}
	return n, nil
}
