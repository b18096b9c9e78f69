// Command standin plays the other parties of a capture demo: a proxy that
// reports what it captured, an app, and a client.
//
//	standin proxy [-ports P,P,...] [-mark M]   (default: the daemon's proxy ports and mark)
//	standin app   [-port 8080] [-name app] [-first-dial ADDR:PORT [-first-dial-port P]]
//	standin dial  ADDR:PORT [-mark 0]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nftredir/nftredir/internal/defaults"
	"github.com/nftredir/nftredir/internal/testkit/standin"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: standin proxy|app|dial ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "proxy":
		err = proxy(os.Args[2:])
	case "app":
		err = app(os.Args[2:])
	case "dial":
		err = dial(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "standin:", err)
		os.Exit(1)
	}
}

func parseMark(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	return uint32(v), err
}

func proxy(args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ExitOnError)
	ports := fs.String("ports", fmt.Sprintf("%d,%d,%d", defaults.OutboundPort, defaults.InboundPort, defaults.HBONEPort), "ports to listen on")
	markFlag := fs.String("mark", fmt.Sprintf("%#x", defaults.ProxyMark), "mark on the proxy's sockets")
	fs.Parse(args)
	mark, err := parseMark(*markFlag)
	if err != nil {
		return err
	}
	lc := standin.ListenConfig(mark)
	for _, p := range strings.Split(*ports, ",") {
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return fmt.Errorf("port %q: %w", p, err)
		}
		ls, err := standin.ListenBoth(context.Background(), lc, uint16(port))
		if err != nil {
			return err
		}
		for _, l := range ls {
			go serve(l, func(c *net.TCPConn) string {
				dst, _, _ := standin.OriginalDst(c)
				line := fmt.Sprintf("captured by proxy :%d  from %s  original destination %s", port, c.RemoteAddr(), dst)
				fmt.Println(line)
				return line
			})
		}
	}
	select {}
}

func app(args []string) error {
	fs := flag.NewFlagSet("app", flag.ExitOnError)
	port := fs.Uint("port", 8080, "port")
	name := fs.String("name", "app", "name to answer with")
	firstDial := fs.String("first-dial", "", "before serving, connect once to `ADDR:PORT`, send a line, and print what answered as one JSON line: how the pod's very first connection was treated")
	firstPort := fs.Uint("first-dial-port", 0, "local `port` of -first-dial (0: any); one below the ephemeral range tells the app's own connection from one a proxy made for it")
	fs.Parse(args)
	if *firstDial != "" {
		printFirstConnection(*firstDial, uint16(*firstPort))
	}
	ls, err := standin.ListenBoth(context.Background(), net.ListenConfig{}, uint16(*port))
	if err != nil {
		return err
	}
	for _, l := range ls {
		go serve(l, func(c *net.TCPConn) string {
			return fmt.Sprintf("answered directly by %s on %s  from %s", *name, c.LocalAddr(), c.RemoteAddr())
		})
	}
	select {}
}

// FirstConnection is what -first-dial prints, as {"firstConnection": ...}.
type FirstConnection struct {
	// Local is the connection's own address (only the port when it failed).
	Local  string `json:"local"`
	To     string `json:"to"`
	Answer string `json:"answer,omitempty"`
	Error  string `json:"error,omitempty"`
}

func printFirstConnection(to string, port uint16) {
	fc := FirstConnection{Local: fmt.Sprintf(":%d", port), To: to}
	d := net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: int(port)}}
	c, err := d.Dial("tcp", to)
	if err == nil {
		fc.Local = c.LocalAddr().String()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		// A line first: the stand-in proxies read one before answering.
		if _, err = fmt.Fprintln(c, "first"); err == nil {
			var line string
			line, err = bufio.NewReader(c).ReadString('\n')
			fc.Answer = strings.TrimSpace(line)
		}
		c.Close()
	}
	if err != nil {
		fc.Error = err.Error()
	}
	json.NewEncoder(os.Stdout).Encode(map[string]FirstConnection{"firstConnection": fc})
}

func serve(l net.Listener, answer func(*net.TCPConn) string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			fmt.Fprintln(c, answer(c.(*net.TCPConn)))
		}()
	}
}

func dial(args []string) error {
	fs := flag.NewFlagSet("dial", flag.ExitOnError)
	markFlag := fs.String("mark", "0", "mark on the client socket")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("dial needs ADDR:PORT")
	}
	mark, err := parseMark(*markFlag)
	if err != nil {
		return err
	}
	d := standin.Dialer(mark)
	d.Timeout = 2 * time.Second
	c, err := d.Dial("tcp", fs.Arg(0))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	fmt.Print(line)
	return nil
}
