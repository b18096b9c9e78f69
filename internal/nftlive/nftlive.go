// Package nftlive reads one nftables table back from the kernel exactly as
// the kernel holds it, and compares its rules with the ones we meant to
// program, expression by expression.
//
// It exists because google/nftables v0.3.0 silently drops every
// expression it cannot decode (tproxy and socket among them) when it lists
// rules, so a rule edited down to "meta l4proto tcp accept" and a capture
// rule look alike through it. Here the kernel's NFTA_RULE_EXPRESSIONS are
// kept raw and compared with the library's own encoding of the expected
// expressions (see Canonical for the few differences the kernel itself
// introduces). The library still programs the tables; this package only
// reads, over its own netlink socket.
//
// Both of nftredir's tables (the pod table and the node table of package
// probe) are read through it by package nft's engine (nft.ReadLive), and
// by nft's Owner: only our own table is listed, never every chain of the
// namespace.
package nftlive

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Table is what the kernel holds of one table: its flags and its chains,
// each with its rules in order. Sets are not read here.
type Table struct {
	Name string
	// Flags as the kernel reports them (NFT_TABLE_F_*), decoded in network
	// byte order; v0.3.0 of the library reads them in host order.
	Flags  uint32
	Chains []*Chain
}

// Dormant reports whether the table is switched off: every chain and rule
// still looks right, yet nothing is evaluated.
func (t *Table) Dormant() bool { return t.Flags&unix.NFT_TABLE_F_DORMANT != 0 }

// Chain returns the chain called name, or nil.
func (t *Table) Chain(name string) *Chain {
	for _, c := range t.Chains {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Chain is one chain as the kernel reports it.
type Chain struct {
	Name string
	// Base is false for a regular chain (no hook).
	Base     bool
	Type     nftables.ChainType
	Hook     nftables.ChainHook
	Priority int32
	Policy   nftables.ChainPolicy
	Rules    []*Rule
}

// Rule is one rule: its handle, raw expressions and comment.
type Rule struct {
	Handle  uint64
	Exprs   []Expr
	Comment string
}

// Expr is one expression: its name and the raw content of NFTA_EXPR_DATA
// (the expression's own attributes), as the kernel sent it or as the
// library encodes it.
type Expr struct {
	Name string
	Data []byte
}

// BaseChain is the shape of a base chain we create: always policy accept.
type BaseChain struct {
	Type     nftables.ChainType
	Hook     *nftables.ChainHook
	Priority int32
}

// SameBase reports whether c is the base chain want describes, with policy
// accept. One place decides it for both tables.
func (c *Chain) SameBase(want BaseChain) bool {
	return c.Base && c.Type == want.Type && want.Hook != nil && c.Hook == *want.Hook &&
		c.Priority == want.Priority && c.Policy == nftables.ChainPolicyAccept
}

// Conn is a netlink socket for reading tables in one namespace.
type Conn struct {
	nl *netlink.Conn
}

// Dial opens a netfilter netlink socket inside the namespace nsFd refers
// to (0: the caller's own namespace). mdlayher/socket creates it on a
// locked OS thread of its own that enters the namespace for the socket()
// call; the caller's goroutine never changes namespace.
func Dial(nsFd int) (*Conn, error) {
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFd})
	if err != nil {
		return nil, fmt.Errorf("netfilter netlink: %w", err)
	}
	return &Conn{nl: nl}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.nl.Close() }

func request(msgType uint16, family nftables.TableFamily, dump bool, attrs []netlink.Attribute) (netlink.Message, error) {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return netlink.Message{}, err
	}
	flags := netlink.Request
	if dump {
		flags |= netlink.Dump
	}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msgType), Flags: flags},
		// nfgenmsg: family, version, resource id.
		Data: append([]byte{byte(family), unix.NFNETLINK_V0, 0, 0}, data...),
	}, nil
}

func (c *Conn) execute(msgType uint16, family nftables.TableFamily, dump bool, attrs []netlink.Attribute) ([]netlink.Message, error) {
	req, err := request(msgType, family, dump, attrs)
	if err != nil {
		return nil, err
	}
	msgs, err := c.nl.Execute(req)
	if err != nil {
		return nil, err
	}
	return msgs, nil
}

func decoder(m netlink.Message) (*netlink.AttributeDecoder, error) {
	if len(m.Data) < 4 {
		return nil, errors.New("short nftables message")
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	return ad, nil
}

// ReadTable reads the table family/name: the table, its chains (listed by
// table: the kernel filters the dump, so other tables' chains are never
// read) and all its rules in one dump. An absent table is an error for
// which IsNotFound holds.
func (c *Conn) ReadTable(family nftables.TableFamily, name string) (*Table, error) {
	nameAttr := func(typ uint16) []netlink.Attribute {
		return []netlink.Attribute{{Type: typ, Data: append([]byte(name), 0)}}
	}
	msgs, err := c.execute(unix.NFT_MSG_GETTABLE, family, false, nameAttr(unix.NFTA_TABLE_NAME))
	if err != nil {
		return nil, fmt.Errorf("get table %s: %w", name, err)
	}
	t := &Table{Name: name}
	for _, m := range msgs {
		ad, err := decoder(m)
		if err != nil {
			return nil, fmt.Errorf("decode table: %w", err)
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_TABLE_FLAGS {
				t.Flags = ad.Uint32()
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("decode table: %w", err)
		}
	}

	msgs, err = c.execute(unix.NFT_MSG_GETCHAIN, family, true, nameAttr(unix.NFTA_CHAIN_TABLE))
	if err != nil {
		return nil, fmt.Errorf("list chains of %s: %w", name, err)
	}
	byName := map[string]*Chain{}
	for _, m := range msgs {
		ch, table, err := decodeChain(m)
		if err != nil {
			return nil, fmt.Errorf("decode chain: %w", err)
		}
		if table != name {
			continue
		}
		t.Chains = append(t.Chains, ch)
		byName[ch.Name] = ch
	}

	msgs, err = c.execute(unix.NFT_MSG_GETRULE, family, true, nameAttr(unix.NFTA_RULE_TABLE))
	if err != nil {
		return nil, fmt.Errorf("list rules of %s: %w", name, err)
	}
	for _, m := range msgs {
		r, table, chain, err := decodeRule(m)
		if err != nil {
			return nil, fmt.Errorf("decode rule: %w", err)
		}
		if table != name {
			continue
		}
		ch := byName[chain]
		if ch == nil {
			// A chain added between the two dumps: read again later.
			return nil, fmt.Errorf("rule of unlisted chain %s (table changed while read)", chain)
		}
		ch.Rules = append(ch.Rules, r)
	}
	return t, nil
}

func decodeChain(m netlink.Message) (*Chain, string, error) {
	ad, err := decoder(m)
	if err != nil {
		return nil, "", err
	}
	ch := &Chain{Policy: nftables.ChainPolicyAccept}
	var table string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_CHAIN_TABLE:
			table = ad.String()
		case unix.NFTA_CHAIN_NAME:
			ch.Name = ad.String()
		case unix.NFTA_CHAIN_TYPE:
			ch.Type = nftables.ChainType(ad.String())
		case unix.NFTA_CHAIN_POLICY:
			ch.Policy = nftables.ChainPolicy(ad.Uint32())
		case unix.NFTA_CHAIN_HOOK:
			ch.Base = true
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				for nad.Next() {
					switch nad.Type() {
					case unix.NFTA_HOOK_HOOKNUM:
						ch.Hook = nftables.ChainHook(nad.Uint32())
					case unix.NFTA_HOOK_PRIORITY:
						ch.Priority = int32(nad.Uint32())
					}
				}
				return nil
			})
		}
	}
	return ch, table, ad.Err()
}

func decodeRule(m netlink.Message) (*Rule, string, string, error) {
	ad, err := decoder(m)
	if err != nil {
		return nil, "", "", err
	}
	r := &Rule{}
	var table, chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_RULE_TABLE:
			table = ad.String()
		case unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		case unix.NFTA_RULE_HANDLE:
			r.Handle = ad.Uint64()
		case unix.NFTA_RULE_USERDATA:
			r.Comment, _ = userdata.GetString(ad.Bytes(), userdata.TypeComment)
		case unix.NFTA_RULE_EXPRESSIONS:
			elems, ok := parseTLVs(ad.Bytes(), nil)
			if !ok {
				return nil, "", "", errors.New("malformed rule expressions")
			}
			r.Exprs = make([]Expr, 0, len(elems))
			for _, el := range elems {
				if el.typ&typeMask != unix.NFTA_LIST_ELEM {
					continue
				}
				e, err := decodeExpr(el.data)
				if err != nil {
					return nil, "", "", err
				}
				r.Exprs = append(r.Exprs, e)
			}
		}
	}
	return r, table, chain, ad.Err()
}

// decodeExpr splits one NFTA_LIST_ELEM into name and raw data.
func decodeExpr(b []byte) (Expr, error) {
	var buf [2]tlv
	attrs, ok := parseTLVs(b, buf[:0])
	if !ok {
		return Expr{}, errors.New("malformed expression")
	}
	var e Expr
	for _, a := range attrs {
		switch a.typ & typeMask {
		case unix.NFTA_EXPR_NAME:
			e.Name = exprName(a.data)
		case unix.NFTA_EXPR_DATA:
			e.Data = a.data
		}
	}
	return e, nil
}

// Encode is the library's encoding of exprs, split the way the kernel
// reports them: what Apply sends, in the form ReadTable returns.
func Encode(family nftables.TableFamily, exprs []expr.Any) ([]Expr, error) {
	out := make([]Expr, 0, len(exprs))
	for _, x := range exprs {
		b, err := expr.Marshal(byte(family), x)
		if err != nil {
			return nil, fmt.Errorf("encode %T: %w", x, err)
		}
		e, err := decodeExpr(b)
		if err != nil {
			return nil, fmt.Errorf("split %T: %w", x, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// IsNotFound reports whether err means the object does not exist.
func IsNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }
