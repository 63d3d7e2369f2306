// Command probe is the node suite's test image program: `probe serve ADDR`
// answers HTTP with the pod's name; `probe get URL...` fetches each URL
// until it answers (https with the pod's service-account token and
// cluster CA, as an in-cluster client does) and prints one line per URL,
// "ok URL STATUS BODY", then sleeps, so that the test reads the result in
// the pod's log through the API server and the kubelet; `probe watch
// FILE` reads the PEM file FILE every second and prints, each time the
// first certificate in it changes, "cert serial=HEX uri=URI at=UNIXNANO"
// (a pod certificate's leaf as the container sees it, and when it read
// it; never the key).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount/"

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: probe serve ADDR | probe get URL... | probe watch FILE")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		name, _ := os.Hostname()
		err := http.ListenAndServe(os.Args[2], http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "hello from %s", name)
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	case "get":
		for _, u := range os.Args[2:] {
			fmt.Println(get(u))
		}
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
	case "watch":
		watch(os.Args[2])
	default:
		os.Exit(2)
	}
}

// watch prints the first certificate of file at once and then each time
// it changes.
func watch(file string) {
	var last []byte
	for tick := time.Tick(time.Second); ; <-tick {
		data, err := os.ReadFile(file)
		if err != nil {
			fmt.Printf("watch %s: %v\n", file, err)
			continue
		}
		for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
			if block.Type != "CERTIFICATE" {
				continue
			}
			if !bytes.Equal(block.Bytes, last) {
				last = block.Bytes
				if cert, err := x509.ParseCertificate(block.Bytes); err != nil {
					fmt.Printf("watch %s: %v\n", file, err)
				} else {
					uri := "none"
					if len(cert.URIs) > 0 {
						uri = cert.URIs[0].String()
					}
					fmt.Printf("cert serial=%x uri=%s at=%d\n", cert.SerialNumber, uri, time.Now().UnixNano())
				}
			}
			break
		}
	}
}

// get retries for a minute: a Service's rules may lag its endpoints.
func get(u string) string {
	client := &http.Client{Timeout: 5 * time.Second}
	var token string
	if strings.HasPrefix(u, "https://") {
		pool := x509.NewCertPool()
		if ca, err := os.ReadFile(saDir + "ca.crt"); err == nil {
			pool.AppendCertsFromPEM(ca)
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
		if b, err := os.ReadFile(saDir + "token"); err == nil {
			token = strings.TrimSpace(string(b))
		}
	}
	var last error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			return fmt.Sprintf("fail %s %v", u, err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			last = err
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return fmt.Sprintf("ok %s %d %s", u, resp.StatusCode, strings.Join(strings.Fields(string(body)), " "))
	}
	return fmt.Sprintf("fail %s %v", u, last)
}
