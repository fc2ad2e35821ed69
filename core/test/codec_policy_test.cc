// Link-aware compression's policy (fl-server --uplink-codec-policy): parsing, the choice by link kind and by
// measured uplink rate, and the refusal of bad specs naming what is accepted.
#include "fl/core/codec_policy.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fl::core {
namespace {

TEST(CodecPolicyParse, EmptyAndFixedGiveEveryClientTheServersUplinkCodec) {
  for (const char* spec : {"", "fixed", " fixed "}) {
    auto p = ParseCodecPolicy(spec, "int8");
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->basis, CodecPolicy::Basis::kFixed);
    EXPECT_EQ(ChooseUplinkCodec(*p, "5g", 1e3), "int8");
    EXPECT_EQ(p->Codecs(), std::vector<std::string>{"int8"});
  }
}

TEST(CodecPolicyParse, ByLinkMapsEachDeclaredKindAndTheRestToTheDefault) {
  auto p = ParseCodecPolicy("by-link:5g=int4, wifi=int8,ethernet=fp32,default=fp16", "fp32");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->basis, CodecPolicy::Basis::kByLink);
  EXPECT_EQ(ChooseUplinkCodec(*p, "5g", std::nullopt), "int4");
  EXPECT_EQ(ChooseUplinkCodec(*p, "wifi", std::nullopt), "int8");
  EXPECT_EQ(ChooseUplinkCodec(*p, "ethernet", std::nullopt), "fp32");
  EXPECT_EQ(ChooseUplinkCodec(*p, "other", std::nullopt), "fp16");
  EXPECT_EQ(ChooseUplinkCodec(*p, "unknown", std::nullopt), "fp16");
  // A measured rate does not matter to a by-link policy.
  EXPECT_EQ(ChooseUplinkCodec(*p, "5g", 1e12), "int4");
  EXPECT_EQ(p->Codecs(), (std::vector<std::string>{"fp16", "fp32", "int4", "int8"}));
  EXPECT_EQ(p->ToString(), "by-link:5g=int4,ethernet=fp32,wifi=int8,default=fp16");
}

TEST(CodecPolicyParse, WithoutADefaultTheServersUplinkCodecIsTheDefault) {
  auto p = ParseCodecPolicy("by-link:5g=int4", "bf16");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(ChooseUplinkCodec(*p, "wifi", std::nullopt), "bf16");
}

TEST(CodecPolicyParse, ByRatePicksTheLargestThresholdAtOrBelowTheMeasuredRate) {
  auto p = ParseCodecPolicy("by-rate:2e7=fp32,1000=int4,2000000=int8,default=fp16", "fp32");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->basis, CodecPolicy::Basis::kByRate);
  EXPECT_EQ(ChooseUplinkCodec(*p, "5g", std::nullopt), "fp16") << "no upload measured yet";
  EXPECT_EQ(ChooseUplinkCodec(*p, "5g", 999.0), "fp16") << "below every threshold";
  EXPECT_EQ(ChooseUplinkCodec(*p, "5g", 1000.0), "int4");
  EXPECT_EQ(ChooseUplinkCodec(*p, "5g", 1'999'999.0), "int4");
  EXPECT_EQ(ChooseUplinkCodec(*p, "5g", 2'000'000.0), "int8");
  EXPECT_EQ(ChooseUplinkCodec(*p, "ethernet", 5e8), "fp32");
  EXPECT_EQ(p->ToString(), "by-rate:1000=int4,2000000=int8,20000000=fp32,default=fp16");
}

TEST(CodecPolicyParse, BadSpecsAreRefusedNamingTheProblemAndWhatIsAccepted) {
  const std::map<std::string, std::string> bad = {
      {"by-speed:5g=int4", "unknown policy 'by-speed'"},
      {"by-link", "needs at least one KEY=CODEC"},
      {"by-link:", "needs at least one KEY=CODEC"},
      {"by-link:6g=int4", "unknown link kind '6g'"},
      {"by-link:5g", "entry '5g' is not KEY=CODEC"},
      {"by-link:5g=int3", "entry '5g=int3'"},
      {"by-link:5g=int4,5g=int8", "'5g' is given twice"},
      {"by-link:default=int4", "names only a default"},
      {"by-rate:fast=int4", "rate 'fast' is not a number of bytes per second >= 0"},
      {"by-rate:-5=int4", "rate '-5'"},
      {"by-rate:1e6x=int4", "rate '1e6x'"},
  };
  for (const auto& [spec, problem] : bad) {
    auto p = ParseCodecPolicy(spec, "fp32");
    ASSERT_FALSE(p.ok()) << spec;
    const std::string message(p.status().message());
    EXPECT_NE(message.find(problem), std::string::npos) << spec << ": " << message;
    EXPECT_NE(message.find("accepted: 'fixed'"), std::string::npos) << message;
    EXPECT_NE(message.find("by-link:5g=int4,wifi=int8,ethernet=fp32,default=fp32"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace fl::core
