package agentflood

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// StreamSecretsPath is the HTTP/2 path of SDS's StreamSecrets.
const StreamSecretsPath = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets"

// H2 is an attacker's own HTTP/2 client on a Unix socket: it ignores the
// limits the server advertises (a gRPC client honours them and would not
// even send a header list above the server's limit).
type H2 struct {
	conn net.Conn
	fr   *http2.Framer
	// Settings are the server's SETTINGS.
	Settings map[http2.SettingID]uint32
}

// DialH2 connects to the socket at path and exchanges SETTINGS; every read
// and write must end within timeout.
func DialH2(path string, timeout time.Duration) (*H2, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	c := &H2{conn: conn, fr: http2.NewFramer(conn, conn), Settings: map[http2.SettingID]uint32{}}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := c.start(timeout); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func (c *H2) start(timeout time.Duration) error {
	if err := c.conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.conn.Write([]byte(http2.ClientPreface)); err != nil {
		return err
	}
	if err := c.fr.WriteSettings(); err != nil {
		return err
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return fmt.Errorf("agentflood: reading the server's SETTINGS: %w", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			_ = s.ForeachSetting(func(s http2.Setting) error { c.Settings[s.ID] = s.Val; return nil })
			return c.fr.WriteSettingsAck()
		}
	}
}

// Close closes the connection.
func (c *H2) Close() error { return c.conn.Close() }

// Open starts a gRPC call of path on stream id (odd, increasing) with pad
// bytes of extra header, in frames of the default maximum size, and sends
// no message. A server that refuses the headers may close the connection
// meanwhile: that error is returned, and Outcomes tells what happened.
func (c *H2) Open(id uint32, path string, pad int) error {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "localhost"}, {":path", path},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"x-pad", strings.Repeat("a", pad)},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return err
		}
	}
	block := hb.Bytes()
	const chunk = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
	first := block[:min(chunk, len(block))]
	block = block[len(first):]
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) == 0})
	for err == nil && len(block) > 0 {
		next := block[:min(chunk, len(block))]
		block = block[len(next):]
		err = c.fr.WriteContinuation(id, len(block) == 0, next)
	}
	return err
}

// Outcomes sends a PING and reads until its ack (the server handles frames
// in order, so its answers to everything sent before come first). It
// returns how the streams that ended did ("rst <code>", "grpc-status <n>");
// closed is set when the connection ended first, goAway to the GOAWAY code
// if one came.
func (c *H2) Outcomes() (ended map[uint32]string, closed bool, goAway string) {
	if err := c.fr.WritePing(false, [8]byte{1}); err != nil {
		return map[uint32]string{}, true, ""
	}
	return c.read()
}

// OpenMany opens n streams of path (ids first, first+2, …) while another
// goroutine reads the server's answers (a server refusing streams answers
// each with RST_STREAM and stops reading from a client that does not read
// them), then returns as Outcomes does. One PING in all: the server's
// keepalive policy closes a connection that pings too often.
func (c *H2) OpenMany(first uint32, n int, path string) (ended map[uint32]string, closed bool, goAway string) {
	type result struct {
		ended  map[uint32]string
		closed bool
		goAway string
	}
	done := make(chan result, 1)
	go func() {
		e, cl, g := c.read()
		done <- result{e, cl, g}
	}()
	for i := range n {
		if err := c.Open(first+uint32(2*i), path, 0); err != nil {
			break
		}
	}
	_ = c.fr.WritePing(false, [8]byte{1})
	r := <-done
	return r.ended, r.closed, r.goAway
}

// read reads frames until a PING ack, and records how streams ended. It
// writes nothing (OpenMany writes meanwhile).
func (c *H2) read() (ended map[uint32]string, closed bool, goAway string) {
	ended = map[uint32]string{}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return ended, true, goAway
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			if f.IsAck() {
				return ended, false, goAway
			}
		case *http2.RSTStreamFrame:
			ended[f.StreamID] = "rst " + f.ErrCode.String()
		case *http2.MetaHeadersFrame:
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					ended[f.StreamID] = "grpc-status " + hf.Value
				}
			}
		case *http2.GoAwayFrame:
			goAway = f.ErrCode.String()
		}
	}
}
