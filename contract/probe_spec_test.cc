#include "contract/probe_spec.h"

#include <gtest/gtest.h>

#include "contract/readiness.h"
#include "contract/ready_spec.h"

namespace dflash {
namespace {

TEST(ProbeUrl, ReadsHostPortAndPath) {
  ProbeSpec p;
  std::string err;
  ASSERT_TRUE(ParseProbeUrl("http://127.0.0.1:8080/health?deep=1", &p, &err)) << err;
  EXPECT_EQ(p.kind, ProbeKind::kHttp);
  EXPECT_EQ(p.host, "127.0.0.1");
  EXPECT_EQ(p.port, 8080);
  EXPECT_EQ(p.path, "/health?deep=1");
  // No port: http's 80; no path: "/"; a query alone gets its "/".
  ASSERT_TRUE(ParseProbeUrl("http://10.0.0.5", &p, &err)) << err;
  EXPECT_EQ(p.port, 80);
  EXPECT_EQ(p.path, "/");
  ASSERT_TRUE(ParseProbeUrl("http://10.0.0.5:81?x", &p, &err)) << err;
  EXPECT_EQ(p.path, "/?x");
  // IPv6 literal in brackets, with and without a port; localhost without DNS.
  ASSERT_TRUE(ParseProbeUrl("http://[::1]:9000/ready", &p, &err)) << err;
  EXPECT_EQ(p.host, "::1");
  EXPECT_EQ(p.port, 9000);
  EXPECT_NE(p.Request().find("Host: [::1]:9000\r\n"), std::string::npos) << p.Request();
  ASSERT_TRUE(ParseProbeUrl("http://[fe80::1]/", &p, &err)) << err;
  EXPECT_EQ(p.port, 80);
  ASSERT_TRUE(ParseProbeUrl("http://localhost:8080/", &p, &err)) << err;
  EXPECT_EQ(p.host, "127.0.0.1");
  EXPECT_EQ(p.Request().rfind("GET / HTTP/1.0\r\n", 0), 0u) << p.Request();
}

TEST(ProbeUrl, RefusesHostileAndUnsupportedInput) {
  ProbeSpec p;
  std::string err;
  struct Case {
    const char* url;
    const char* says;
  } cases[] = {
      {"https://127.0.0.1:8443/health", "https is not spoken"},
      {"ftp://127.0.0.1/", "not an http:// URL"},
      {"127.0.0.1:8080", "not an http:// URL"},
      {"http://", "no host"},
      {"http://:8080/", "no host"},
      {"http://example.com/health", "would need DNS"},
      {"http://127.0.0.1:/", "port '' is not a number"},
      {"http://127.0.0.1:0/", "port '0'"},
      {"http://127.0.0.1:65536/", "port '65536'"},
      {"http://127.0.0.1:99999999999999999999/", "is not a number"},
      {"http://127.0.0.1:80x/", "port '80x'"},
      {"http://[::1/", "closing ']'"},
      {"http://[::1]x/", "after the IPv6 address"},
      {"http://[not-v6]:80/", "is not an IPv6 address"},
      {"http://user:pw@127.0.0.1/", "user info"},
      {"http://127.0.0.1/a b", "space or control byte"},
      {"http://127.0.0.1/x\r\nX-Evil: 1", "space or control byte"},
      {"http://127.0.0.1/x#frag", "fragment"},
  };
  for (const Case& c : cases) {
    err.clear();
    EXPECT_FALSE(ParseProbeUrl(c.url, &p, &err)) << c.url;
    EXPECT_NE(err.find(c.says), std::string::npos) << c.url << ": " << err;
  }
}

TEST(ProbeTcp, ReadsPortOrAddressAndPort) {
  ProbeSpec p;
  std::string err;
  ASSERT_TRUE(ParseTcpTarget("8080", &p, &err)) << err;
  EXPECT_EQ(p.host, "127.0.0.1");
  EXPECT_EQ(p.port, 8080);
  ASSERT_TRUE(ParseTcpTarget("[::1]:7000", &p, &err)) << err;
  EXPECT_EQ(p.host, "::1");
  EXPECT_EQ(p.port, 7000);
  EXPECT_EQ(p.Describe(), "tcp [::1]:7000");
  EXPECT_FALSE(ParseTcpTarget("http", &p, &err));  // a named port: not yet
  EXPECT_FALSE(ParseTcpTarget("db.local:5432", &p, &err));
  EXPECT_NE(err.find("DNS"), std::string::npos) << err;
  EXPECT_FALSE(ParseTcpTarget("[::1]", &p, &err));
}

TEST(StatusSet, MatchesClassesAndCodes) {
  StatusSet s;
  EXPECT_TRUE(s.Matches(200));  // the default is 2xx
  EXPECT_TRUE(s.Matches(299));
  EXPECT_FALSE(s.Matches(301));
  std::string err;
  ASSERT_TRUE(s.Parse("200, 204", &err)) << err;
  EXPECT_TRUE(s.Matches(204));
  EXPECT_FALSE(s.Matches(201));
  ASSERT_TRUE(s.Parse("2xx,301", &err)) << err;
  EXPECT_TRUE(s.Matches(250));
  EXPECT_TRUE(s.Matches(301));
  EXPECT_FALSE(s.Matches(302));
  EXPECT_FALSE(s.Matches(503));
  for (const char* bad : {"", "2", "2x", "20", "2000", "6xx", "0xx", "600", "099", "200,", "ok", "2xx;3xx"}) {
    StatusSet t;
    EXPECT_FALSE(t.Parse(bad, &err)) << bad;
    EXPECT_TRUE(t.Matches(200)) << "a failed Parse leaves the set as it was: " << bad;
  }
}

TEST(StatusLine, ParsesTheFirstLineOnly) {
  int st = 0;
  std::string err;
  ASSERT_TRUE(ParseStatusLine("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", true, &st, &err)) << err;
  EXPECT_EQ(st, 200);
  ASSERT_TRUE(ParseStatusLine("HTTP/1.0 503\r\n", true, &st, &err)) << err;  // no reason phrase
  EXPECT_EQ(st, 503);
  ASSERT_TRUE(ParseStatusLine("HTTP/1.0 204 No Content", true, &st, &err)) << err;  // EOF, no newline
  EXPECT_EQ(st, 204);
}

TEST(StatusLine, RefusesGarbageAndHugeLines) {
  int st = 0;
  std::string err;
  EXPECT_FALSE(ParseStatusLine("SSH-2.0-OpenSSH_9.2\r\n", true, &st, &err));
  EXPECT_NE(err.find("not an HTTP status line: 'SSH-2.0-OpenSSH_9.2'"), std::string::npos) << err;
  EXPECT_FALSE(ParseStatusLine(std::string("\x00\xff\x01garbage\n", 11), true, &st, &err));
  EXPECT_NE(err.find("\\x00\\xff\\x01garbage"), std::string::npos) << err;
  EXPECT_FALSE(ParseStatusLine("HTTP/1.1 20 OK\r\n", true, &st, &err));
  EXPECT_FALSE(ParseStatusLine("HTTP/1.1 2000 OK\r\n", true, &st, &err));
  EXPECT_FALSE(ParseStatusLine("HTTP/1.1 abc OK\r\n", true, &st, &err));
  EXPECT_FALSE(ParseStatusLine("", true, &st, &err));
  EXPECT_NE(err.find("closed the connection without answering"), std::string::npos) << err;
  // A first line longer than the bounded read: no answer, and the message stays short.
  std::string huge = "HTTP/1.1 200 " + std::string(kMaxStatusLine, 'x');
  huge.resize(kMaxStatusLine);
  EXPECT_FALSE(ParseStatusLine(huge, false, &st, &err));
  EXPECT_NE(err.find("no status line within 1024 bytes"), std::string::npos) << err;
  EXPECT_LT(err.size(), 200u);
  EXPECT_FALSE(ParseStatusLine("HTTP/1.1 2", false, &st, &err));
}

TEST(JudgeProbe, SaysWhatItSaw) {
  ProbeSpec http;
  std::string err, detail;
  ASSERT_TRUE(ParseProbeUrl("http://127.0.0.1:1/", &http, &err));
  EXPECT_TRUE(JudgeProbe(http, true, "HTTP/1.0 200 OK\r\n", true, "", &detail));
  EXPECT_EQ(detail, "HTTP 200");
  EXPECT_FALSE(JudgeProbe(http, true, "HTTP/1.0 503 Busy\r\n", true, "", &detail));
  EXPECT_EQ(detail, "HTTP 503 (wanted 2xx)");
  EXPECT_FALSE(JudgeProbe(http, false, "", false, "connection refused", &detail));
  EXPECT_EQ(detail, "connection refused");
  ProbeSpec tcp;
  EXPECT_TRUE(JudgeProbe(tcp, true, "", false, "", &detail));
  EXPECT_EQ(detail, "connected");
}

TEST(ReadySpec, ParsesProbeModes) {
  ReadySpec s;
  std::string err;
  ASSERT_TRUE(ParseReadySpec("tcp:8080", &s, &err)) << err;
  EXPECT_EQ(s.mode, ReadyMode::kTcp);
  EXPECT_EQ(s.probe.port, 8080);
  ASSERT_TRUE(ParseReadySpec("http:http://127.0.0.1:8080/health", &s, &err)) << err;
  EXPECT_EQ(s.mode, ReadyMode::kHttp);
  EXPECT_EQ(s.probe.path, "/health");
  EXPECT_EQ(FormatReadySpec(s), "http:http://127.0.0.1:8080/health");
  EXPECT_FALSE(ParseReadySpec("http:https://127.0.0.1/", &s, &err));
  EXPECT_NE(err.find("https is not spoken"), std::string::npos) << err;
  EXPECT_FALSE(ParseReadySpec("tcp", &s, &err));
  EXPECT_NE(err.find("tcp:<port>"), std::string::npos) << err;
  EXPECT_FALSE(ParseReadySpec("tcp:99999", &s, &err));
}

// The readiness rules hold for probes as for every other evidence.
TEST(Readiness, ProbeAnswersCountOnlyFromALiveProcess) {
  ReadySpec s;
  std::string err;
  ASSERT_TRUE(ParseReadySpec("http:http://127.0.0.1:8080/", &s, &err));
  s.timeout = Millis(1000);
  auto t0 = Readiness::Clock::time_point{} + std::chrono::hours(1);
  {
    Readiness r(s);
    ASSERT_TRUE(r.Init(&err));
    EXPECT_FALSE(r.WantsProbe()) << "not before exec";
    r.OnExec(t0);
    EXPECT_TRUE(r.WantsProbe());
    EXPECT_FALSE(r.OnProbe(false, "HTTP 503 (wanted 2xx)"));
    EXPECT_TRUE(r.OnClock(t0 + Millis(1000)));
    EXPECT_NE(r.TimeoutText().find("never answered with 2xx; last try: HTTP 503 (wanted 2xx)"), std::string::npos)
        << r.TimeoutText();
  }
  {
    Readiness r(s);
    r.OnExec(t0);
    r.OnExit(false);  // it crashed; an answer now is another server's, or its last gasp
    EXPECT_FALSE(r.OnProbe(true, "HTTP 200"));
    EXPECT_TRUE(r.discounted_evidence());
    r.OnExitDrained();
    EXPECT_EQ(r.verdict(), Readiness::Verdict::kFailed);
  }
  {
    Readiness r(s);
    r.OnExec(t0);
    EXPECT_TRUE(r.OnProbe(true, "HTTP 200"));
    EXPECT_FALSE(r.WantsProbe());
    EXPECT_FALSE(r.OnProbe(true, "HTTP 200")) << "ready is reported once";
  }
}

}  // namespace
}  // namespace dflash
